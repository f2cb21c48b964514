"""Scenarios 3, 4, 7: scaling, spot preemption, too few nodes, a user bug.

The test plays the user (``kubectl scale``), the cloud (taints, the Eviction
API with its ``DisruptionTarget`` condition) and the autoscaler (capacity
comes back); the operator and agents are the real ones.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException

from e2e.cluster import Cluster
from e2e.operator_proc import OperatorProcess
from e2e.trainlog import LogFollower
from e2e.workload import PROCESS_NODE, TrainingJob, apply, get_job, running_workers, worker_pods
from tests.e2e.buggy_train import MARKER
from tests.e2e.checks import (
    assert_no_step_lost,
    assert_progress_sound,
    checkpoint_step,
    current_round,
    event_reasons,
    wait_event,
    wait_phase,
    wait_training,
    wait_world,
)
from tests.support import wait_for

# Whole training runs on a 2-core machine: more than the suite's default limit.
pytestmark = pytest.mark.timeout(600)

SPOT_TAINT = "torchflex.io/e2e-no-capacity"


@pytest.fixture()
def no_capacity(cluster: Cluster) -> Iterator[None]:
    """Removes the process node's capacity taint whatever the test did."""
    try:
        yield
    finally:
        cluster.kubectl("taint", "node", PROCESS_NODE, f"{SPOT_TAINT}-", check=False)


def _capacity(cluster: Cluster, present: bool) -> None:
    """The cloud takes the node's spare capacity away (taint) or gives it back."""
    if present:
        cluster.kubectl("taint", "node", PROCESS_NODE, f"{SPOT_TAINT}-")
    else:
        cluster.kubectl("taint", "node", PROCESS_NODE, f"{SPOT_TAINT}=true:NoSchedule")


def _evict(cluster: Cluster, namespace: str, pod: str) -> None:
    """The Eviction API, as a spot reclaim or drain does it (DisruptionTarget condition)."""
    from kubernetes import client

    api = client.CoreV1Api(cluster.api_client())
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod, namespace=namespace))
    api.create_namespaced_pod_eviction(pod, namespace, body)


def test_scale_up_and_down_within_bounds(
    cluster: Cluster,
    namespace: str,
    operator_proc: OperatorProcess,
    follower: LogFollower,
    ckpt_dir: Path,
) -> None:
    job = TrainingJob("scale", ckpt_dir, min_replicas=1, max_replicas=3, replicas=2, steps=5000)
    apply(cluster, namespace, job.manifest())
    wait_training(follower, 5, 240, world=2)

    t_up = time.monotonic()
    cluster.kubectl("scale", "ej/scale", "-n", namespace, "--replicas=3")
    wait_world(follower, 3, t_up, 180, min_round=current_round(follower) + 1)

    t_down = time.monotonic()
    cluster.kubectl("scale", "ej/scale", "-n", namespace, "--replicas=1")
    wait_world(follower, 1, t_down, 180, min_round=current_round(follower) + 1)
    wait_for(
        lambda: running_workers(cluster, namespace, "scale") == ["scale-worker-0"],
        120,
        "only worker 0 left",
    )
    step_after_down = follower.last_step()
    wait_training(follower, step_after_down + 5, 60, world=1)

    for bad in ("0", "4"):
        out = cluster.kubectl(
            "scale", "ej/scale", "-n", namespace, f"--replicas={bad}", check=False
        )
        assert out.returncode != 0, f"--replicas={bad} was accepted"
        assert "replicas" in out.stderr, out.stderr
    status = get_job(cluster, namespace, "scale")["status"]
    assert status["desiredReplicas"] == 1
    assert status["failures"] == 0, "scaling must never count as a failure"
    reasons = event_reasons(cluster, namespace, "scale")
    assert "ScaledUp" in reasons and "ScaledDown" in reasons
    assert_progress_sound(follower)
    # Leaving pods checkpointed on SIGTERM: nothing trained was lost.
    assert checkpoint_step(ckpt_dir) > 0
    cluster.kubectl("delete", "ej/scale", "-n", namespace, "--wait=false")


@pytest.mark.usefixtures("no_capacity")
def test_spot_preemption_loses_no_steps_and_grows_back(
    cluster: Cluster,
    namespace: str,
    operator_proc: OperatorProcess,
    follower: LogFollower,
    ckpt_dir: Path,
) -> None:
    # 600 steps of 0.1 s: enough that the job still trains when the replacement joins, even
    # when a loaded machine takes 20 s to start its agent (at 250 it finished at world 2).
    job = TrainingJob("spot", ckpt_dir, min_replicas=2, max_replicas=3, steps=600, backoff_limit=0)
    apply(cluster, namespace, job.manifest())
    wait_training(follower, 20, 240, world=3)

    _capacity(cluster, present=False)
    t_evict = time.monotonic()
    round_at_evict = current_round(follower)
    _evict(cluster, namespace, "spot-worker-2")
    # The job keeps going at reduced size; the replacement waits for capacity.
    wait_world(follower, 2, t_evict, 120, min_round=round_at_evict + 1)
    # Every rank stopped at the same step on SIGTERM and rank 0 saved it: the
    # new round resumes from exactly the last step the old round trained.
    assert_no_step_lost(follower, round_at_evict)
    wait_for(
        lambda: any(
            p["metadata"]["name"] == "spot-worker-2"
            and p.get("status", {}).get("phase") == "Pending"
            for p in worker_pods(cluster, namespace, "spot")
        ),
        60,
        "the replacement pod pending for capacity",
    )
    # The autoscaler brings capacity back: the group grows to 3 again.
    t_capacity = time.monotonic()
    _capacity(cluster, present=True)
    wait_world(follower, 3, t_capacity, 180, min_round=current_round(follower) + 1)
    wait_phase(cluster, namespace, "spot", "Succeeded", 300)

    status = get_job(cluster, namespace, "spot")["status"]
    assert status["failures"] == 0, "a preemption must not count against backoffLimit"
    assert_progress_sound(follower)
    assert checkpoint_step(ckpt_dir) == 600


@pytest.mark.usefixtures("no_capacity")
def test_below_min_replicas_fails_after_timeout_with_reason(
    cluster: Cluster,
    namespace: str,
    operator_proc: OperatorProcess,
    follower: LogFollower,
    ckpt_dir: Path,
) -> None:
    job = TrainingJob(
        "starved", ckpt_dir, min_replicas=2, max_replicas=2, steps=5000, min_available_timeout_s=15
    )
    apply(cluster, namespace, job.manifest())
    wait_training(follower, 5, 240, world=2)

    _capacity(cluster, present=False)
    # At its minimum the job's PodDisruptionBudget refuses a voluntary eviction (a drain
    # waits); a spot node reclaimed past its notice takes the pod anyway: a delete.
    with pytest.raises(ApiException) as refused:
        _evict(cluster, namespace, "starved-worker-1")
    assert refused.value.status == 429, refused.value
    cluster.kubectl("delete", "pod", "starved-worker-1", "-n", namespace, "--wait=false")
    wait_for(
        lambda: (
            get_job(cluster, namespace, "starved")["status"].get("phase")
            in ("Restarting", "Pending")
        ),
        60,
        "the job below minReplicas",
    )
    t_below = time.monotonic()
    wait_phase(cluster, namespace, "starved", "Failed", 120)
    waited = time.monotonic() - t_below
    status = get_job(cluster, namespace, "starved")["status"]
    failed = [c for c in status["conditions"] if c["type"] == "Failed"]
    assert failed and failed[0]["status"] == "True"
    assert failed[0]["reason"] == "MinAvailableTimeout"
    assert "minReplicas" in failed[0]["message"] or "min" in failed[0]["message"].lower()
    assert waited > 5, "failed before the timeout could have elapsed"
    wait_event(cluster, namespace, "starved", "Failed")


def test_user_bug_restarts_in_pod_then_fails_with_the_error(
    cluster: Cluster,
    namespace: str,
    operator_proc: OperatorProcess,
    follower: LogFollower,
    ckpt_dir: Path,
) -> None:
    job = TrainingJob(
        "buggy",
        ckpt_dir,
        min_replicas=2,
        max_replicas=2,
        max_restarts=2,
        backoff_limit=0,
        script="tests/e2e/buggy_train.py",
    )
    apply(cluster, namespace, job.manifest())
    wait_phase(cluster, namespace, "buggy", "Failed", 300)

    status = get_job(cluster, namespace, "buggy")["status"]
    assert MARKER in status["lastFailure"]["message"], status["lastFailure"]
    assert status["lastFailure"]["reason"] == "UserError"
    failed = [c for c in status["conditions"] if c["type"] == "Failed"]
    assert failed and failed[0]["reason"] == "BackoffLimitExceeded"
    events = [e for e in _events(cluster, namespace, "buggy") if MARKER in e.get("message", "")]
    assert events, "no Event carries the worker's error"
    # The group was restarted in-pod maxRestarts times before giving up:
    # three attempts (restart counts 0, 1, 2) each trained and hit the bug.
    logs = "\n".join(
        p.read_text(errors="replace") for p in cluster.layout.pods.glob(f"{namespace}_*/*.log")
    )
    attempts = {f"restart={n}" in logs for n in range(3)}
    assert attempts == {True}, "expected restart counts 0, 1 and 2 in the workers' output"


def _events(cluster: Cluster, namespace: str, name: str) -> list[dict[str, str]]:
    from e2e.workload import job_events

    return job_events(cluster, namespace, name)
