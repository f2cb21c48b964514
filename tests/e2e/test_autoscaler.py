"""cluster-autoscaler grows, shrinks and scales down around an elastic job, on spot nodes.

The real cluster-autoscaler (built from its Go module, ``externalgrpc`` cloud
provider) runs against the test cloud of e2e/autoscaler, whose ``spot`` node
group starts and stops process-kubelet nodes; the operator, agents and torch
workers are the real ones. Each worker asks for 10 of a node's 16 CPUs, so
one worker fits a node: the job (min 1, max 3) starts at 1 on the cluster's
own node and its 2 pending workers are the autoscaler's signal. The test
plays no part of the autoscaler: it reclaims a spot node the way a node
termination handler does (``TestCloud.reclaim``) and scales the job down,
and watches what the autoscaler does.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.autoscaler import autoscaler
from e2e.autoscaler.cloud import TestCloud
from e2e.autoscaler.groups import Groups, GroupSpec
from e2e.cluster import Cluster, processes
from e2e.polling import poll_until
from e2e.trainlog import LogFollower
from e2e.workload import TrainingJob, apply, get_job, worker_pods
from tests.e2e.checks import (
    assert_no_step_lost,
    assert_progress_sound,
    current_round,
    wait_reformed,
    wait_training,
    wait_world,
)

pytestmark = pytest.mark.timeout(600)
NAME = "auto"
WORKER_CPU = "10"  # of the process node's 16: one worker per node


@pytest.fixture()
def cloud(cluster: Cluster) -> Iterator[TestCloud]:
    """The test cloud with one spot group of up to 2 nodes, and the autoscaler on it."""
    cloud = TestCloud(cluster, Groups.of(GroupSpec("spot", 0, 2, spot=True))).start()
    autoscaler.start(cluster, cloud)
    try:
        yield cloud
    finally:
        autoscaler.stop(cluster)
        _print_story(cluster, cloud)
        cloud.stop()


def _manifest(ckpt_dir: Path) -> dict[str, Any]:
    job = TrainingJob(NAME, ckpt_dir, min_replicas=1, max_replicas=3, steps=100000, backoff_limit=0)
    manifest = job.manifest()
    pod_spec = manifest["spec"]["template"]["spec"]
    del pod_spec["nodeSelector"]  # any node: the cluster's own, or the cloud's
    pod_spec["containers"][0]["resources"] = {"requests": {"cpu": WORKER_CPU}}
    return manifest


def _print_story(cluster: Cluster, cloud: TestCloud) -> None:
    """What the cloud, the autoscaler and each cloud node's kubelet did (pytest shows it
    when the test fails): the autoscaler's scale-up/down decisions, not only its last
    lines, which repeat its scan every second."""
    print(f"--- test cloud timeline ---\n{cloud.timeline}")
    decisions = re.compile(r"scale-up|Scale-up|Scale-down|unneeded|unregistered|unready|NotReady")
    text = processes.exit_status_hint(cluster.layout.logs, autoscaler.NAME, 100_000)
    picked = [ln for ln in text.splitlines() if decisions.search(ln)][-40:]
    print("--- cluster-autoscaler decisions ---\n" + "\n".join(picked))
    print(f"--- cluster-autoscaler log, last lines ---\n{autoscaler.log_tail(cluster, 10)}")
    for log in sorted(cluster.layout.logs.glob("cloud-*.log")):
        tail = processes.exit_status_hint(cluster.layout.logs, log.stem, 15)
        print(f"--- {log.name}, last lines ---\n{tail}")


def _events(cloud: TestCloud, what: str) -> list[str]:
    return [node for _, kind, node in cloud.timeline if kind == what]


def _spot_nodes(cluster: Cluster) -> list[str]:
    nodes = cluster.get_json("nodes", "-l", "torchflex.io/e2e-node-group=spot")["items"]
    return sorted(n["metadata"]["name"] for n in nodes)


def _node_of(cluster: Cluster, namespace: str, pod: str) -> str:
    for p in worker_pods(cluster, namespace, NAME):
        if p["metadata"]["name"] == pod:
            return str(p["spec"].get("nodeName") or "")
    return ""


@pytest.mark.usefixtures("operator_proc")
def test_autoscaler_grows_the_job_spot_reclaim_shrinks_it_idle_nodes_go(
    cluster: Cluster,
    namespace: str,
    follower: LogFollower,
    ckpt_dir: Path,
    cloud: TestCloud,
) -> None:
    apply(cluster, namespace, _manifest(ckpt_dir))
    wait_training(follower, 3, 240)
    pdb = cluster.get_json("pdb", NAME, "-n", namespace)
    assert pdb["spec"]["minAvailable"] == 1

    # Pending workers above the minimum: the autoscaler adds 2 spot nodes and
    # the job grows to maxReplicas.
    world3 = wait_world(follower, 3, 0.0, 300)
    assert len(_events(cloud, "requested")) == 2, cloud.timeline
    assert len(_spot_nodes(cluster)) == 2
    assert get_job(cluster, namespace, NAME)["status"]["failures"] == 0

    # The cloud reclaims a spot node: its worker is evicted (DisruptionTarget), the
    # job goes on at 2 with no step lost, the autoscaler brings a node back.
    spot = _node_of(cluster, namespace, f"{NAME}-worker-2") or _spot_nodes(cluster)[0]
    round_at_evict = current_round(follower)
    cloud.reclaim(spot)
    # Usually at 2 first; straight back at 3 if the new node's worker makes the
    # re-forming round's last call (timing).
    _, world = wait_reformed(follower, round_at_evict, 180)
    assert world in {2, 3}, world
    assert_no_step_lost(follower, round_at_evict)
    wait_world(follower, 3, world3, 300, min_round=round_at_evict + 1)
    assert len(_events(cloud, "requested")) == 3, cloud.timeline
    status = get_job(cluster, namespace, NAME)["status"]
    assert status["failures"] == 0, "a reclaim must not count against backoffLimit"

    # The job shrinks to its minimum: the 2 spot nodes idle, the autoscaler removes them.
    cluster.kubectl("scale", f"ej/{NAME}", "-n", namespace, "--replicas=1")
    gone = poll_until(lambda: not _spot_nodes(cluster) and not cloud.groups.instances, 180, 1.0)
    assert gone, f"idle spot nodes left: {_spot_nodes(cluster)}; {cloud.timeline}"
    assert len(_events(cloud, "deleted")) == 2, cloud.timeline
    assert_progress_sound(follower)
    cluster.kubectl("delete", f"ej/{NAME}", "-n", namespace, "--wait=false")
