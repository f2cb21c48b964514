"""ElasticJobs whose pods run the agent image on the real node (issue 16).

The user's path, end to end: ``helm install`` of the chart with the operator
image built here, an ElasticJob whose trainer runs ``docker/agent.Dockerfile``
(torch from PyPI, pulled from the local registry), the c10d store pod from the
same image, names through CoreDNS, training read back with ``kubectl logs``.
One job (on one real node, so its pods share the kubelet) walks through what
only containers show, then trains to ``Succeeded``:

- the agent is PID 1 of its container and reaps orphans re-parented to it;
- ``/dev/shm`` is the operator's memory-backed emptyDir (``spec.sharedMemory``),
  and a DataLoader with worker processes moves more through it than a
  runtime's default 64 MiB holds;
- a warm spare (``spec.warmSpares: 1``): a third pod whose agent waits out of
  the rendezvous; ``kubectl scale`` up promotes that very pod (the kubelet
  projects the operator's annotation patch into its downward-API file) and
  the group re-forms with three;
- a worker container SIGKILLed by containerd (as an OOM kill or a runtime
  crash does): the survivors re-form, the operator replaces the pod;
- the Eviction API (a spot reclaim): the evicted pod's agent gets SIGTERM,
  every rank stops at the same step, rank 0 saves it and the next round
  resumes from it: zero steps lost;
- ``kubectl scale`` down to one, and the job finishes.

Agents never call the API server (``automountServiceAccountToken: false``);
the operator reaches it through the bridge (``test_operator_image``).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from benchmarks._cluster_logs import agent_stamp, all_at_world, parse_events
from e2e.cluster import Cluster
from e2e.realnode import RealNode
from e2e.realnode.imagebuild import PushedImage
from e2e.realnode.plan import CRI_NAMESPACE, NODE_LABEL
from e2e.trainlog import Line, parse_text
from tests.e2e.checks import checkpoint_step
from tests.integration.install.release import Release
from tests.realnode.test_operator_image import _values
from tests.support import wait_for
from torchflex_contract import labels

JOB = "rn"
# At most 10 steps/s (--step-time 0.1): the scenarios below take longer than 700 steps.
STEPS = 1000
CKPT_MOUNT = "/checkpoints"

# More than the 64 MiB a runtime gives /dev/shm: 2 workers x prefetch 2 x 32 MiB
# batches in flight, each passed from a DataLoader worker through shared memory.
DATALOADER = """
import torch
from torch.utils.data import DataLoader, Dataset
class Big(Dataset):
    def __len__(self): return 8
    def __getitem__(self, i): return torch.full((8 * 1024 * 1024,), float(i))  # 32 MiB
seen = [float(b[0, 0]) for b in DataLoader(Big(), batch_size=1, num_workers=2)]
assert sorted(seen) == [float(i) for i in range(8)], seen
print("dataloader ok", len(seen))
"""


def _job(image: PushedImage, ckpt: Path) -> dict[str, Any]:
    trainer = {
        "name": labels.TRAINER_CONTAINER,
        "image": image.reference,
        "imagePullPolicy": "IfNotPresent",
        "workingDir": "/workspace",
        "command": ["python", "examples/train_elastic.py", "--steps", str(STEPS)],
        "args": ["--step-time", "0.1", "--ckpt-dir", CKPT_MOUNT, "--ckpt-every", "20"],
        # Step lines end with the worker's wall clock (t=): the join is timed from them.
        "env": [{"name": "TRAIN_PRINT_TIME", "value": "1"}],
        "volumeMounts": [{"name": "ckpt", "mountPath": CKPT_MOUNT}],
    }
    return {
        "apiVersion": labels.API_VERSION,
        "kind": labels.KIND,
        "metadata": {"name": JOB},
        "spec": {
            "minReplicas": 1,
            "maxReplicas": 3,
            "replicas": 2,
            "warmSpares": 1,
            "nprocPerNode": 1,
            "backoffLimit": 3,
            "template": {
                "spec": {
                    "nodeSelector": {NODE_LABEL: "true"},
                    "terminationGracePeriodSeconds": 30,
                    "volumes": [
                        {"name": "ckpt", "hostPath": {"path": str(ckpt), "type": "Directory"}}
                    ],
                    "containers": [trainer],
                }
            },
        },
    }


class Job:
    """What the test reads of the job: its pods and their ``kubectl logs``."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster = cluster
        self.ns = namespace

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.cluster.kubectl("-n", self.ns, *args, check=check)

    def pod(self, index: int) -> dict[str, Any]:
        return self.cluster.get_json("pod", labels.worker_pod_name(JOB, index), "-n", self.ns)

    def uid(self, index: int) -> str | None:
        """The pod's UID; None while there is no such pod (deleted, its replacement not
        created yet: a wait for the replacement must read that as "not yet")."""
        name = labels.worker_pod_name(JOB, index)
        out = self.kubectl("get", "pod", name, "-o", "jsonpath={.metadata.uid}", check=False)
        return (out.stdout.strip() or None) if out.returncode == 0 else None

    def lines(self, index: int) -> list[Line]:
        name = labels.worker_pod_name(JOB, index)
        out = self.kubectl("logs", name, check=False)
        return parse_text(out.stdout, name) if out.returncode == 0 else []

    def steps(self, index: int) -> list[Line]:
        return [ln for ln in self.lines(index) if ln.kind == "step"]

    def current_round(self, index: int) -> int:
        return max((ln.round for ln in self.lines(index)), default=-1)

    def wait_world(self, world: int, after_round: int, timeout_s: float) -> None:
        """Worker 0 (never stopped here) trains at ``world`` in a round past ``after_round``."""
        wait_for(
            lambda: [s for s in self.steps(0) if s.round > after_round and s.world == world],
            timeout_s,
            f"worker 0 training at world size {world} after round {after_round}",
            interval_s=1.0,
        )

    def status(self) -> dict[str, Any]:
        job = self.cluster.get_json("elasticjob", JOB, "-n", self.ns)
        return dict(job.get("status") or {})

    def phase(self) -> str:
        return str(self.status().get("phase", ""))

    def exec(self, index: int, script: str) -> tuple[int, str]:
        out = self.kubectl(
            "exec", labels.worker_pod_name(JOB, index), "-c", labels.TRAINER_CONTAINER,
            "--", "sh", "-c", script, check=False,
        )  # fmt: skip
        return out.returncode, out.stdout + out.stderr


def _print_join(job: Job, spare_name: str, t_scale: float) -> None:
    """How long the promotion took on a real kubelet (printed, never asserted: a figure)."""

    def joined() -> float | None:
        logs = [job.kubectl("logs", labels.worker_pod_name(JOB, i)).stdout for i in range(3)]
        return all_at_world({str(i): parse_events(t.splitlines()) for i, t in enumerate(logs)},
                            t_scale, 3)  # fmt: skip

    wait_for(lambda: joined() is not None, 120, "all 3 pods step at world 3", interval_s=1.0)
    done = joined()
    assert done is not None
    spare_log = job.kubectl("logs", spare_name).stdout.splitlines()
    promoted = [t for ln in spare_log if "promoted after" in ln and (t := agent_stamp(ln))]
    assert promoted, "the spare's agent never logged its promotion"
    print(
        f"real node: kubectl scale -> spare promoted {promoted[0] - t_scale:.2f} s, "
        f"-> all 3 pods step at world 3 {done - t_scale:.2f} s"
    )


def _container_kill(node: RealNode, pod: dict[str, Any]) -> None:
    """SIGKILL the trainer's task in containerd (what an OOM kill or crash looks like)."""
    (status,) = pod["status"]["containerStatuses"]
    cid = status["containerID"].removeprefix("containerd://")
    argv = ["ctr", "--address", str(node.paths.socket), "--namespace", CRI_NAMESPACE]
    subprocess.run([*argv, "tasks", "kill", "-s", "SIGKILL", cid], check=True, timeout=30)


def _evict(cluster: Cluster, namespace: str, pod: str) -> None:
    from kubernetes import client

    api = client.CoreV1Api(cluster.api_client())
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod, namespace=namespace))
    api.create_namespaced_pod_eviction(pod, namespace, body)


@pytest.fixture()
def job_story(cluster: Cluster, release: Release) -> Iterator[None]:
    """What the job went through (Events, status, pods): pytest shows it when the test fails."""
    yield
    ns = release.namespace
    for args in (
        ("get", "events", "-n", ns, "--sort-by=.lastTimestamp"),
        ("get", "elasticjob", JOB, "-n", ns, "-o", "jsonpath={.status}"),
        ("get", "pods", "-n", ns, "-o", "wide"),
    ):
        print(cluster.kubectl(*args, check=False).stdout[-6000:])


# func_only: the session's image builds (the agent image cold: torch from PyPI, 7 min to
# build and 4 min to push at load 10, bounded by their own 3600 s) are its fixtures' and
# not counted here; the first pull of the image is, in the first wait below.
@pytest.mark.timeout(900, func_only=True)
@pytest.mark.usefixtures("job_story")
def test_an_elasticjob_of_agent_image_pods_trains_through_kill_scale_and_eviction(
    cluster: Cluster,
    real_node: RealNode,
    operator_pushed: PushedImage,
    agent_pushed: PushedImage,
    release: Release,
) -> None:
    values = _values(cluster, operator_pushed, {"mode": "cluster", "namespaces": []})
    # The real agent wraps the trainer's command (the install tests' "env" stands in for it).
    values["operator"].pop("agentCommand")
    release.install(values)
    release.wait_running(1, timeout_s=180)
    # The node's host directory for the job's checkpoints (removed with the node).
    ckpt = real_node.paths.root / "checkpoints" / release.namespace
    ckpt.mkdir(parents=True)
    os.chmod(ckpt, 0o777)  # the image's user is 65532; hostPath keeps the host's mode
    job = Job(cluster, release.namespace)
    cluster.kubectl(
        "apply", "-n", release.namespace, "-f", "-", input=yaml.safe_dump(_job(agent_pushed, ckpt))
    )

    # Two workers train (the first pull of the agent image is in this wait).
    job.wait_world(2, -1, 600)
    spare_name = labels.worker_pod_name(JOB, 2)
    store = cluster.get_json("pod", labels.store_pod_name(JOB), "-n", release.namespace)
    assert store["spec"]["nodeName"] == real_node.name
    pod0 = job.pod(0)
    assert pod0["spec"]["nodeName"] == real_node.name
    (status,) = pod0["status"]["containerStatuses"]
    assert status["imageID"].startswith(f"{agent_pushed.address}/torchflex-agent@sha256:")

    # kubectl logs: the agent's rank prefix on every worker line.
    log = job.kubectl("logs", labels.worker_pod_name(JOB, 0)).stdout
    assert "[rank 0] step=" in log or "[rank 1] step=" in log, log[-2000:]

    # The agent is PID 1 and reaps an orphan re-parented to it.
    rc, out = job.exec(0, "tr '\\0' ' ' </proc/1/cmdline")
    assert rc == 0 and out.startswith("/opt/torchflex/bin/python "), out
    assert "torchflex-agent -- python examples/train_elastic.py" in out, out
    orphan = "sh -c 'sleep 1 & exit 0'; sleep 3; grep -l '^State:.*Z' /proc/[0-9]*/status || true"
    rc, out = job.exec(0, orphan)
    assert rc == 0 and out.strip() == "", f"zombies left: {out}"

    # /dev/shm: the operator's memory-backed emptyDir, and a DataLoader with workers uses it.
    rc, out = job.exec(0, "grep ' /dev/shm ' /proc/mounts")
    assert rc == 0 and out.split()[2] == "tmpfs" and "size=1048576k" in out, out
    rc, out = job.exec(0, f"python -c '{DATALOADER}'")
    assert rc == 0 and "dataloader ok 8" in out, out

    # The warm spare: worker 2 runs, its agent waits out of the rendezvous.
    wait_for(
        lambda: "standby: warm spare" in job.kubectl("logs", spare_name, check=False).stdout,
        300,
        f"{spare_name} waiting as a warm spare",
        interval_s=1.0,
    )
    spare = job.pod(2)
    assert spare["metadata"]["annotations"][labels.Annotation.STANDBY.value] == "true"
    assert job.status().get("warmSpares") == 1, job.status()

    # kubectl scale up: the spare itself is promoted and three train.
    before = job.current_round(0)
    t_scale = time.time()
    job.kubectl("scale", f"ej/{JOB}", "--replicas=3")
    job.wait_world(3, before, 240)
    _print_join(job, spare_name, t_scale)
    promoted = job.pod(2)
    assert promoted["metadata"]["uid"] == spare["metadata"]["uid"], (
        "a new pod joined, not the spare"
    )
    assert promoted["metadata"]["annotations"][labels.Annotation.STANDBY.value] == "false"
    assert "promoted after" in job.kubectl("logs", spare_name).stdout

    # A worker container killed: the survivors re-form and the pod is replaced.
    victim = job.pod(2)
    before = job.current_round(0)
    _container_kill(real_node, victim)
    job.wait_world(2, before, 240)
    wait_for(
        lambda: job.uid(2) not in (None, victim["metadata"]["uid"]),
        120,
        "worker 2 replaced by a new pod",
        interval_s=1.0,
    )
    job.wait_world(3, job.current_round(0), 300)

    # A spot-style eviction: zero steps lost.
    failures = job.status()["failures"]
    before = job.current_round(0)
    _evict(cluster, release.namespace, labels.worker_pod_name(JOB, 2))
    job.wait_world(2, before, 240)
    # Every rank stopped at the same step and rank 0 (on whichever pod) saved it:
    # worker 0's rank resumes from exactly the last step the old round trained.
    lines = job.lines(0)
    trained = max(ln.step for ln in lines if ln.kind == "step" and ln.round == before)
    resumed = [ln.step for ln in lines if ln.kind == "resumed" and ln.round > before]
    assert resumed and resumed[0] == trained, f"trained to {trained}, resumed from {resumed}"
    after = min(ln.step for ln in job.lines(0) if ln.kind == "step" and ln.round > before)
    assert after == trained + 1, f"steps lost or redone: trained to {trained}, next {after}"

    # kubectl scale down to one, and the job finishes.
    before = job.current_round(0)
    job.kubectl("scale", f"ej/{JOB}", "--replicas=1")
    job.wait_world(1, before, 240)
    wait_for(lambda: job.phase() == "Succeeded", 300, f"{JOB} Succeeded", interval_s=2.0)
    assert checkpoint_step(ckpt) == STEPS
    # Neither the eviction nor the scaling counted as a failure.
    assert job.status()["failures"] == failures, job.status()


@pytest.mark.timeout(300, func_only=True)  # as above: a cold image build is the fixture's
def test_without_the_memory_backed_dev_shm_the_same_dataloader_fails(
    cluster: Cluster, real_node: RealNode, agent_pushed: PushedImage, namespace: str
) -> None:
    """Why ``spec.sharedMemory`` exists: a bare pod of the agent image has the
    runtime's 64 MiB ``/dev/shm``, and the DataLoader above cannot pass its
    batches through it."""
    script = f"df -k /dev/shm; python -c '{DATALOADER}'"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "no-shm"},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {NODE_LABEL: "true"},
            "automountServiceAccountToken": False,
            "containers": [
                {"name": "c", "image": agent_pushed.reference, "command": ["sh", "-c", script]}
            ],
        },
    }
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(pod))

    def phase() -> str:
        return str(cluster.get_json("pod", "no-shm", "-n", namespace)["status"].get("phase"))

    wait_for(lambda: phase() in ("Succeeded", "Failed"), 180, "no-shm finished", interval_s=1.0)
    log = cluster.kubectl("logs", "no-shm", "-n", namespace).stdout
    assert phase() == "Failed", log[-2000:]
    assert " 65536 " in log.splitlines()[1], log[:500]  # df -k: 64 MiB
    assert "No space left on device" in log and "DataLoader worker" in log, log[-2000:]
