"""Issue 13: a pod of another namespace attacks a running job's c10d store.

The attacker (tests/e2e/attacker.py) runs in a namespace of its own with no
RBAC, is handed the victim's store and worker pod IPs, and tries what the
issue reproduced: mark the job closed as failed through the unauthenticated
store, and ask an agent for its status.

- With ``networkPolicy.enabled: false`` the attack must work and the victim
  must end Failed with the attacker's message: the test is known to bite.
- With the defaults the operator creates the job's NetworkPolicy (checked on
  the real API server, with the pods' missing ServiceAccount token), and with
  a real enforcer on the cluster (kube-network-policies, e2e/cluster/enforcer.py)
  the attack must fail to connect and the victim must succeed. On a kernel
  without the nftables queue expression that enforcer cannot run; that test
  then reports itself skipped with the kernel's reason, never passed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster import Cluster, enforcer
from e2e.trainlog import LogFollower
from e2e.workload import PROCESS_NODE, TrainingJob, apply, get_job, worker_pods
from tests.e2e.attacker import MESSAGE
from tests.e2e.checks import wait_phase, wait_training
from tests.support import fresh_namespace, wait_for
from torchflex_contract import labels

pytestmark = pytest.mark.timeout(600)


@pytest.fixture()
def other_namespace(cluster: Cluster) -> Iterator[str]:
    with fresh_namespace(cluster, "atk") as name:
        yield name


@pytest.fixture()
def enforced(cluster: Cluster) -> Iterator[None]:
    """The NetworkPolicy enforcer for this test only (it costs every new connection)."""
    lacking = enforcer.kernel_lacks_nft_queue()
    if lacking is not None:
        pytest.skip(f"no NetworkPolicy enforcer can run here: {lacking}")
    enforcer.start(cluster.layout, cluster.bin_dir, cluster.process_node)
    try:
        yield
    finally:
        enforcer.stop(cluster.layout)


def _victim(name: str, ckpt_dir: Path, *, policy: bool, steps: int = 600) -> dict[str, Any]:
    """Two workers; ``steps`` of 0.1 s leave the attacker pod (torch import) ample time."""
    manifest = TrainingJob(name, ckpt_dir, min_replicas=2, max_replicas=2, steps=steps).manifest()
    if not policy:
        manifest["spec"]["networkPolicy"] = {"enabled": False}
    return manifest


def _pod_ip(cluster: Cluster, namespace: str, pod: str) -> str:
    out = cluster.kubectl(
        "get", "pod", pod, "-n", namespace, "-o", "jsonpath={.status.podIP}", check=False
    )
    return out.stdout.strip()


def _attack(cluster: Cluster, namespace: str, victim_ns: str, job: str) -> dict[str, Any]:
    """Run the attacker pod against ``job``; returns its JSON report."""
    store_ip = _pod_ip(cluster, victim_ns, labels.store_pod_name(job))
    worker_ip = _pod_ip(cluster, victim_ns, labels.worker_pod_name(job, 0))
    assert store_ip and worker_ip, "victim pods have no IPs"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "attacker"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": PROCESS_NODE},
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "attacker",
                    "image": "attacker:local",
                    "command": ["python", "tests/e2e/attacker.py", store_ip, worker_ip],
                }
            ],
        },
    }
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(pod))
    terminated: dict[str, Any] = {}

    def finished() -> bool:
        got = cluster.get_json("pod", "attacker", "-n", namespace)
        for cs in got.get("status", {}).get("containerStatuses") or []:
            terminated.update((cs.get("state") or {}).get("terminated") or {})
        return bool(terminated)

    wait_for(finished, 120, "attacker pod finished")
    report: dict[str, Any] = json.loads(terminated.get("message") or "{}")
    report["exitCode"] = terminated.get("exitCode")
    return report


@pytest.mark.usefixtures("operator_proc")
def test_attack_disturbs_a_job_that_opted_out_of_its_policy(
    cluster: Cluster,
    namespace: str,
    other_namespace: str,
    follower: LogFollower,
    ckpt_dir: Path,
) -> None:
    # Long enough never to finish by itself: only the attack can end it.
    apply(cluster, namespace, _victim("open", ckpt_dir, policy=False, steps=6000))
    wait_training(follower, 10, 240, world=2)
    policies = cluster.get_json("networkpolicies", "-n", namespace)["items"]
    assert policies == [], "an opted-out job must get no NetworkPolicy"

    report = _attack(cluster, other_namespace, namespace, "open")
    assert report["store"] == "written", report
    assert report["exitCode"] == 0, report
    assert report["agent_status"] == 200, report
    # The victim's agents re-form, read the forged closure and give up.
    wait_phase(cluster, namespace, "open", "Failed", 180)
    status = get_job(cluster, namespace, "open")["status"]
    assert MESSAGE in json.dumps(status.get("lastFailure")), status.get("lastFailure")


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


@pytest.mark.usefixtures("enforced", "operator_proc")
def test_attack_fails_against_the_default_policy(
    cluster: Cluster,
    namespace: str,
    other_namespace: str,
    follower: LogFollower,
    ckpt_dir: Path,
) -> None:
    apply(cluster, namespace, _victim("shut", ckpt_dir, policy=True))
    wait_training(follower, 10, 240, world=2)

    report = _attack(cluster, other_namespace, namespace, "shut")
    assert report["store"] == "unreachable", report
    assert report["agent_status"] == "unreachable", report
    assert report["exitCode"] == 3, report
    # The operator (on the node) still reads the agents, and the job trains to the end.
    wait_phase(cluster, namespace, "shut", "Succeeded", 300)
    assert get_job(cluster, namespace, "shut")["status"]["worldSize"] == 2
