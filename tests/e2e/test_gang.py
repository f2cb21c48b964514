"""Gang scheduling of the minimum: two jobs that cannot both run never deadlock.

Two ElasticJobs of ``minReplicas: 3`` (``maxReplicas: 3``) on a node with
room for 4 worker pods. Placed one pod at a time, each job could get 2 pods
and neither ever reaches its minimum. With the Workload API on (the local
control plane's flags, ``e2e/cluster/controlplane.py``) each job owns a
PodGroup with a gang ``minCount`` of 3: the scheduler places one job's
minimum whole and none of the other's, says so on the other's PodGroup, and
places the other whole once the first job's pods end. Real operator process,
real agents and torch workers; the room is made by cpu requests against the
process node's allocatable cpu.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import Cluster
from e2e.operator_proc import OperatorProcess
from e2e.trainlog import LogFollower
from e2e.workload import PROCESS_NODE, TrainingJob, apply, get_job, worker_pods
from tests.e2e.checks import wait_phase
from tests.support import wait_for

pytestmark = pytest.mark.timeout(600)
NAMES = ("gang-a", "gang-b")
MIN = 3
# Left free besides the 4 workers: both jobs' store pods (100m each) and slack.
OTHER_MILLICPU = 1000


def _millicpu(quantity: str) -> int:
    return int(quantity[:-1]) if quantity.endswith("m") else int(float(quantity) * 1000)


def _worker_millicpu(cluster: Cluster) -> int:
    """A cpu request such that 4 worker pods fit on the process node and 5 do not."""
    node = cluster.get_json("node", PROCESS_NODE)
    allocatable = _millicpu(node["status"]["allocatable"]["cpu"])
    per_pod = (allocatable - OTHER_MILLICPU) // 4
    assert 5 * per_pod > allocatable, "the node would hold a fifth worker"
    return per_pod


def _pod_group_verdict(cluster: Cluster, ns: str, name: str) -> dict[str, Any] | None:
    """The scheduler's PodGroupInitiallyScheduled condition on the job's PodGroup."""
    out = cluster.kubectl(
        "get", "podgroups.scheduling.k8s.io", name, "-n", ns, "-o", "json", check=False
    )
    if out.returncode != 0:  # the operator has not created it yet
        return None
    group = json.loads(out.stdout)
    conditions = (group.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "PodGroupInitiallyScheduled"), None)


def _bound(cluster: Cluster, ns: str, name: str) -> list[dict[str, Any]]:
    return [p for p in worker_pods(cluster, ns, name) if p["spec"].get("nodeName")]


def _scheduled_at(pod: dict[str, Any]) -> str:
    conds = pod["status"].get("conditions") or []
    return str(next(c["lastTransitionTime"] for c in conds if c["type"] == "PodScheduled"))


def _finished_at(pod: dict[str, Any]) -> str:
    (state,) = pod["status"]["containerStatuses"]
    return str(state["state"]["terminated"]["finishedAt"])


def test_two_jobs_of_min_3_on_room_for_4_one_runs_whole_the_other_waits_whole(
    cluster: Cluster,
    namespace: str,
    operator_proc: OperatorProcess,
    follower: LogFollower,
    ckpt_dir: Path,
) -> None:
    cpu = f"{_worker_millicpu(cluster)}m"
    for name in NAMES:
        job = TrainingJob(name, ckpt_dir / name, min_replicas=MIN, max_replicas=MIN, steps=40)
        manifest = job.manifest()
        (trainer,) = manifest["spec"]["template"]["spec"]["containers"]
        trainer["resources"] = {"requests": {"cpu": cpu}}
        apply(cluster, namespace, manifest)

    # One job's minimum is placed whole; the scheduler refuses the other gang whole.
    def verdicts() -> dict[str, str]:
        out = {}
        for name in NAMES:
            cond = _pod_group_verdict(cluster, namespace, name)
            if cond is not None:
                out[name] = cond["status"]
        return out

    wait_for(lambda: sorted(verdicts().values()) == ["False", "True"], 180, "one gang placed")
    first = next(n for n, s in verdicts().items() if s == "True")
    second = next(n for n in NAMES if n != first)
    refused = _pod_group_verdict(cluster, namespace, second)
    assert refused is not None and refused["reason"] == "Unschedulable", refused
    assert len(_bound(cluster, namespace, first)) == MIN
    waiting = worker_pods(cluster, namespace, second)
    assert len(waiting) == MIN, (
        "the waiting job's pods exist (they wait for room, not the operator)"
    )
    assert _bound(cluster, namespace, second) == [], "the waiting job holds no node capacity"
    for name in NAMES:
        assert get_job(cluster, namespace, name)["status"]["gangScheduling"] == "Enabled"

    # The first trains whole and ends; then the second is placed whole and trains.
    wait_phase(cluster, namespace, first, "Succeeded", 300)
    wait_phase(cluster, namespace, second, "Succeeded", 300)

    # No pod of the second was bound before room was freed by the first's pods
    # ending (2 of its 3 had to end for 3 to fit): it never held part of the node.
    finished = sorted(_finished_at(p) for p in worker_pods(cluster, namespace, first))
    scheduled = sorted(_scheduled_at(p) for p in worker_pods(cluster, namespace, second))
    assert scheduled[0] >= finished[1], (scheduled, finished)
    for name in NAMES:
        worlds = {ln.world for ln in follower.lines("step") if ln.pod.startswith(f"{name}-")}
        assert worlds == {MIN}, f"{name} trained at world sizes {worlds}"
        assert get_job(cluster, namespace, name)["status"]["worldSize"] == MIN
