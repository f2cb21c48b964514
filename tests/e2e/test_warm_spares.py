"""Scenario: a warm spare pod takes the scale-up (``spec.warmSpares``).

The user asks for one warm spare; the operator keeps one extra pod running
whose agent has imported torch but stays out of the rendezvous. ``kubectl
scale`` up promotes that very pod (one annotation patch, projected into the
pod by the kubelet's downward-API volume) instead of creating a cold one;
scaling down removes the promoted pod and a fresh spare takes its place.
The operator, the agents and the process kubelet are the real ones.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import Cluster
from e2e.operator_proc import OperatorProcess
from e2e.trainlog import LogFollower
from e2e.workload import TrainingJob, apply, get_job, worker_pods
from tests.e2e.checks import (
    assert_progress_sound,
    current_round,
    wait_event,
    wait_training,
    wait_world,
)
from tests.support import wait_for
from torchflex_contract import labels

# Whole training runs on a 2-core machine: more than the suite's default limit.
pytestmark = pytest.mark.timeout(600)

JOB = "spare"
SPARE = labels.worker_pod_name(JOB, 2)
STANDBY_LINE = "standby: warm spare"


def _pod(cluster: Cluster, ns: str, name: str) -> dict[str, Any] | None:
    return next((p for p in worker_pods(cluster, ns, JOB) if p["metadata"]["name"] == name), None)


def _standby(pod: dict[str, Any]) -> str | None:
    annotations: dict[str, str] = pod["metadata"].get("annotations") or {}
    return annotations.get(labels.Annotation.STANDBY)


def _log(cluster: Cluster, ns: str, pod: dict[str, Any]) -> str:
    meta = pod["metadata"]
    path: Path = cluster.layout.pods / f"{ns}_{meta['name']}_{meta['uid']}" / "trainer.log"
    return path.read_text(errors="replace") if path.exists() else ""


def _wait_spare_waiting(cluster: Cluster, ns: str, old_uid: str | None, timeout_s: float) -> str:
    """Wait until the spare pod (a new incarnation if ``old_uid``) runs and its agent waits."""

    def waiting() -> bool:
        pod = _pod(cluster, ns, SPARE)
        return (
            pod is not None
            and pod["metadata"]["uid"] != old_uid
            and not pod["metadata"].get("deletionTimestamp")
            and _standby(pod) == "true"
            and STANDBY_LINE in _log(cluster, ns, pod)
        )

    wait_for(waiting, timeout_s, f"{SPARE} running as a waiting warm spare")
    pod = _pod(cluster, ns, SPARE)
    assert pod is not None
    return str(pod["metadata"]["uid"])


def test_scale_up_promotes_the_warm_spare_and_scale_down_makes_a_new_one(
    cluster: Cluster,
    namespace: str,
    operator_proc: OperatorProcess,
    follower: LogFollower,
    ckpt_dir: Path,
) -> None:
    job = TrainingJob(
        JOB, ckpt_dir, min_replicas=2, max_replicas=3, replicas=2, warm_spares=1, steps=5000
    )
    apply(cluster, namespace, job.manifest())
    wait_training(follower, 5, 240, world=2)
    spare_uid = _wait_spare_waiting(cluster, namespace, None, 180)
    # The waiting spare is not a member: the group of 2 trains on beside it.
    t_waiting = time.monotonic()
    wait_training(follower, follower.last_step() + 5, 60, world=2, after=t_waiting)
    assert {ln.world for ln in follower.lines("step")} == {2}
    assert get_job(cluster, namespace, JOB)["status"].get("warmSpares") == 1

    t_up = time.monotonic()
    cluster.kubectl("scale", f"ej/{JOB}", "-n", namespace, "--replicas=3")
    wait_world(follower, 3, t_up, 120, min_round=current_round(follower) + 1)
    promoted = _pod(cluster, namespace, SPARE)
    assert promoted is not None
    assert promoted["metadata"]["uid"] == spare_uid, "the spare itself must join, not a new pod"
    assert _standby(promoted) == "false"
    wait_event(cluster, namespace, JOB, "SparePromoted")
    # At maxReplicas there is no room left to grow into: no spare.
    wait_for(
        lambda: not get_job(cluster, namespace, JOB)["status"].get("warmSpares"),
        60,
        "status.warmSpares back to 0 at maxReplicas",
    )
    assert len(worker_pods(cluster, namespace, JOB)) == 3

    t_down = time.monotonic()
    cluster.kubectl("scale", f"ej/{JOB}", "-n", namespace, "--replicas=2")
    wait_world(follower, 2, t_down, 120, min_round=current_round(follower) + 1)
    # The promoted pod left the group; a fresh spare takes index 2 again.
    _wait_spare_waiting(cluster, namespace, spare_uid, 180)
    wait_for(
        lambda: get_job(cluster, namespace, JOB)["status"].get("warmSpares") == 1,
        60,
        "status.warmSpares back to 1",
    )
    wait_training(follower, follower.last_step() + 5, 60, world=2, after=time.monotonic())
    status = get_job(cluster, namespace, JOB)["status"]
    assert status["failures"] == 0, "spares and scaling must never count as failures"
    assert_progress_sound(follower)
    cluster.kubectl("delete", f"ej/{JOB}", "-n", namespace, "--wait=false")
