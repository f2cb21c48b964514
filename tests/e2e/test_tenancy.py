"""Issues 13 and 30: a pod of another namespace attacks a running job's c10d store.

The attacker (tests/e2e/attacker.py) runs in a namespace of its own with no
RBAC, is handed the victim's store and worker pod IPs, and tries what issue
13 reproduced: mark the job closed as failed through the unauthenticated
store, and ask an agent for its status.

Both sides in one test, under one real enforcer (kube-router's firewall,
e2e/cluster/enforcer.py), which must run: no skip.

- With the defaults the operator creates the job's NetworkPolicy; once
  kube-router applies it to the job's pods the attack cannot connect, while a
  pod with the job's label in the job's namespace (the peer the policy
  admits) reads the same store and agent, and the victim trains on to
  Succeeded.
- With ``networkPolicy.enabled: false`` the same attack, under the same
  enforcer, writes into the store and the victim ends Failed with the
  attacker's message: the test is known to bite, and the refusal above is
  the policy's, not the enforcer's blocking everything.

The policy's shape and the pods' missing ServiceAccount token are checked on
the real API server by the second test (no enforcer needed).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster import Cluster, enforcer, firewall
from e2e.trainlog import LogFollower
from e2e.workload import PROCESS_NODE, TrainingJob, apply, get_job, worker_pods
from tests.e2e.attacker import MESSAGE
from tests.e2e.checks import wait_phase, wait_training
from tests.support import fresh_namespace, wait_for
from torchflex_contract import labels

pytestmark = pytest.mark.timeout(600)

# A new pod is admitted once kube-router has seen its address (a sync on its pod
# event); the probe keeps trying that long. The attack gives up after its default 8 s.
PROBE_TIMEOUT_S = 45.0


@pytest.fixture()
def other_namespace(cluster: Cluster) -> Iterator[str]:
    with fresh_namespace(cluster, "atk") as name:
        yield name


@pytest.fixture()
def enforced(cluster: Cluster) -> Iterator[None]:
    """kube-router's firewall for this test only; stopping it removes its rules and ipsets."""
    enforcer.start(cluster.layout, cluster.bin_dir, cluster.process_node)
    try:
        yield
    finally:
        enforcer.stop(cluster.layout)


def _victim(name: str, ckpt_dir: Path, *, policy: bool, steps: int = 600) -> dict[str, Any]:
    """Two workers; ``steps`` of 0.1 s leave the attacker pod (torch import) ample time."""
    job = TrainingJob(name, ckpt_dir / name, min_replicas=2, max_replicas=2, steps=steps)
    manifest = job.manifest()
    if not policy:
        manifest["spec"]["networkPolicy"] = {"enabled": False}
    return manifest


def _pod_ip(cluster: Cluster, namespace: str, pod: str) -> str:
    out = cluster.kubectl(
        "get", "pod", pod, "-n", namespace, "-o", "jsonpath={.status.podIP}", check=False
    )
    return out.stdout.strip()


def _targets(cluster: Cluster, namespace: str, job: str) -> tuple[str, str]:
    """The victim's store and first worker pod IPs."""
    store_ip = _pod_ip(cluster, namespace, labels.store_pod_name(job))
    worker_ip = _pod_ip(cluster, namespace, labels.worker_pod_name(job, 0))
    assert store_ip and worker_ip, "victim pods have no IPs"
    return store_ip, worker_ip


def _start_probe(
    cluster: Cluster,
    namespace: str,
    pod: str,
    targets: tuple[str, str],
    *,
    read_only: bool = False,
    pod_labels: dict[str, str] | None = None,
) -> None:
    """A pod running tests/e2e/attacker.py against ``targets`` (store IP, worker IP)."""
    command = ["python", "tests/e2e/attacker.py", *targets]
    if read_only:
        command += ["--probe", "--timeout", str(PROBE_TIMEOUT_S)]
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod, "labels": pod_labels or {}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": PROCESS_NODE},
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "containers": [{"name": "attacker", "image": "attacker:local", "command": command}],
        },
    }
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest))


def _report(cluster: Cluster, namespace: str, pod: str) -> dict[str, Any]:
    """The probe pod's JSON report, once it has ended."""
    terminated: dict[str, Any] = {}

    def finished() -> bool:
        got = cluster.get_json("pod", pod, "-n", namespace)
        for cs in got.get("status", {}).get("containerStatuses") or []:
            terminated.update((cs.get("state") or {}).get("terminated") or {})
        return bool(terminated)

    wait_for(finished, 120, f"probe pod {namespace}/{pod} finished")
    report: dict[str, Any] = json.loads(terminated.get("message") or "{}")
    report["exitCode"] = terminated.get("exitCode")
    return report


def _refused_while_the_job_trains_on(
    cluster: Cluster, namespace: str, other_namespace: str, follower: LogFollower, ckpt_dir: Path
) -> None:
    """The default job: its policy applied, the attack refused, its own peer admitted."""
    apply(cluster, namespace, _victim("shut", ckpt_dir, policy=True))
    wait_training(follower, 10, 240, world=2)
    targets = _targets(cluster, namespace, "shut")
    ips = [*targets, _pod_ip(cluster, namespace, labels.worker_pod_name("shut", 1))]
    firewall.wait_policy_applied(ips, labels.network_policy_name("shut"), 60)

    # Side by side: the attack from another namespace, and a pod the policy admits
    # (the job's label, the job's namespace) that only reads.
    _start_probe(cluster, other_namespace, "attacker", targets)
    own = {labels.Label.JOB_NAME.value: "shut"}
    _start_probe(cluster, namespace, "peer", targets, read_only=True, pod_labels=own)
    attack = _report(cluster, other_namespace, "attacker")
    assert attack["store"] == "unreachable", attack
    assert attack["agent_status"] == "unreachable", attack
    assert attack["exitCode"] == 3, attack
    peer = _report(cluster, namespace, "peer")
    assert peer["store"] == "read", peer
    assert peer["agent_status"] == 200, peer
    assert peer["exitCode"] == 0, peer
    # Still running after both: the store was there all along, so "unreachable" was the policy.
    assert get_job(cluster, namespace, "shut")["status"]["phase"] == "Running"

    # The operator (on the node) still reads the agents, and the job trains to the end
    # in its first round: nothing failed, restarted or was replaced.
    wait_phase(cluster, namespace, "shut", "Succeeded", 300)
    status = get_job(cluster, namespace, "shut")["status"]
    assert status["worldSize"] == 2
    assert [status.get(k, 0) for k in ("failures", "restarts", "replacements")] == [0, 0, 0], status


def _open_and_disturbed(
    cluster: Cluster, namespace: str, other_namespace: str, follower: LogFollower, ckpt_dir: Path
) -> None:
    """The opted-out job, under the same enforcer: the same attack gets through."""
    applied = time.monotonic()
    # Long enough never to finish by itself: only the attack can end it.
    apply(cluster, namespace, _victim("open", ckpt_dir, policy=False, steps=6000))
    wait_training(follower, 10, 240, world=2, after=applied)
    policies = cluster.get_json("networkpolicies", "-n", namespace)["items"]
    names = [p["metadata"]["name"] for p in policies]
    assert labels.network_policy_name("open") not in names, "an opted-out job must get no policy"

    attack_pod = "attacker-open"
    _start_probe(cluster, other_namespace, attack_pod, _targets(cluster, namespace, "open"))
    report = _report(cluster, other_namespace, attack_pod)
    assert report["store"] == "written", report
    assert report["exitCode"] == 0, report
    assert report["agent_status"] == 200, report
    # The victim's agents re-form, read the forged closure and give up.
    wait_phase(cluster, namespace, "open", "Failed", 180)
    status = get_job(cluster, namespace, "open")["status"]
    assert MESSAGE in json.dumps(status.get("lastFailure")), status.get("lastFailure")


@pytest.mark.usefixtures("enforced", "operator_proc")
def test_the_policy_refuses_another_namespace_and_an_opted_out_job_is_open(
    cluster: Cluster,
    namespace: str,
    other_namespace: str,
    follower: LogFollower,
    ckpt_dir: Path,
) -> None:
    _refused_while_the_job_trains_on(cluster, namespace, other_namespace, follower, ckpt_dir)
    _open_and_disturbed(cluster, namespace, other_namespace, follower, ckpt_dir)


@pytest.mark.usefixtures("operator_proc")
def test_default_job_owns_a_policy_and_its_pods_carry_no_token(
    cluster: Cluster, namespace: str, ckpt_dir: Path
) -> None:
    manifest = _victim("shut", ckpt_dir, policy=True)
    manifest["spec"]["template"]["spec"]["serviceAccountName"] = "default"
    apply(cluster, namespace, manifest)
    name = labels.network_policy_name("shut")

    def policy() -> dict[str, Any] | None:
        out = cluster.kubectl(
            "get", "networkpolicy", name, "-n", namespace, "-o", "json", check=False
        )
        return json.loads(out.stdout) if out.returncode == 0 else None

    wait_for(policy, 60, f"NetworkPolicy {name}")
    got = policy()
    assert got is not None
    uid = get_job(cluster, namespace, "shut")["metadata"]["uid"]
    assert [r["uid"] for r in got["metadata"]["ownerReferences"]] == [uid]
    selector = got["spec"]["podSelector"]["matchLabels"]
    wait_for(lambda: len(worker_pods(cluster, namespace, "shut")) == 2, 60, "2 worker pods")
    pods = cluster.get_json("pods", "-n", namespace)["items"]
    assert {p["metadata"]["name"] for p in pods} >= {"shut-store", "shut-worker-0", "shut-worker-1"}
    for pod in pods:
        assert selector.items() <= pod["metadata"]["labels"].items(), pod["metadata"]["name"]
        # The API server's ServiceAccount admission adds no token volume.
        assert pod["spec"]["automountServiceAccountToken"] is False
        volumes = [v["name"] for v in pod["spec"].get("volumes") or []]
        assert not any(v.startswith("kube-api-access") for v in volumes), volumes

    # Opting out on a live job removes the policy (level-triggered, not only at creation).
    cluster.kubectl(
        "patch", "elasticjob", "shut", "-n", namespace, "--type=merge",
        "-p", '{"spec":{"networkPolicy":{"enabled":false}}}',
    )  # fmt: skip
    wait_for(lambda: policy() is None, 60, f"NetworkPolicy {name} deleted after opt-out")
