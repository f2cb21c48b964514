"""Scenario 16 (issue 28): failures that leave every process alive, on the local cluster.

The real operator, real agents and real torch workers run ``stall_train.py``
(the example's loop; the agent watches it through the fork server's hooks).

1. Rank 1 stops taking part at step 30, its process alive: no socket closes,
   every heartbeat goes on. The agents must declare a hang within the job's
   ``hangTimeoutSeconds``, restart the workers once (a counted restart), and
   the job train again and succeed; ``status.lastFailure`` names rank 1 and
   its pod and carries every rank's stack (rank 1's in its own code, the
   others waiting in torch), with a ``HangDetected`` Event; no checkpoint goes
   backwards.
2. Rank 0 evaluates for twice the timeout inside ``pulse.paused`` while the
   others wait in a barrier: no hang, no restart, the job succeeds.
3. One pod's process tree runs under a CPU quota of a tenth of a CPU (a cgroup,
   as a container's CPU limit): it is named a straggler in ``status.stragglers``
   with a ``StragglerDetected`` Event, and with ``stragglerPolicy: Replace`` its
   pod is deleted, its node avoided (``status.avoidedNodes``; the replacement
   stays Pending, this cluster has one node), and the job trains on without it
   at world size 2 to ``Succeeded``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e import throttle
from e2e.cluster import Cluster
from e2e.kubelet import records
from e2e.trainlog import CheckpointWatcher, LogFollower
from e2e.workload import PROCESS_NODE, TrainingJob, apply, get_job
from tests.e2e.checks import (
    assert_checkpoints_never_backwards,
    checkpoint_step,
    event_reasons,
    wait_event,
    wait_phase,
)
from tests.support import wait_for

pytestmark = pytest.mark.timeout(600)
TIMEOUT_S = 15


def hang_job(
    name: str, ckpt_dir: Path, steps: int, env: tuple[tuple[str, str], ...]
) -> TrainingJob:
    return TrainingJob(
        name,
        ckpt_dir,
        min_replicas=3,
        max_replicas=3,
        steps=steps,
        script="tests/e2e/stall_train.py",
        extra_env=env,
    )


def with_hang_timeout(manifest: dict[str, object]) -> dict[str, object]:
    spec = manifest["spec"]
    assert isinstance(spec, dict)
    spec["hangTimeoutSeconds"] = TIMEOUT_S
    return manifest


@pytest.mark.usefixtures("operator_proc")
def test_a_rank_that_stops_taking_part_is_named_and_the_job_trains_again(
    cluster: Cluster, namespace: str, ckpt_dir: Path, follower: LogFollower
) -> None:
    name, steps = "stall", 80
    job = hang_job(name, ckpt_dir, steps, (("STALL_RANK", "1"), ("STALL_AT", "30")))
    with CheckpointWatcher(ckpt_dir) as watcher:
        apply(cluster, namespace, with_hang_timeout(job.manifest()))
        wait_phase(cluster, namespace, name, "Succeeded", 400)
        assert_checkpoints_never_backwards(watcher, follower)
    steps_seen = follower.lines("step")
    hung_round = min(ln.round for ln in steps_seen if ln.step == 29)
    stalled = [ln for ln in steps_seen if ln.round == hung_round]
    assert max(ln.step for ln in stalled) == 29, "rank 1 should stop every rank at step 30"
    after = [ln for ln in steps_seen if ln.round > hung_round]
    assert after and all(ln.world == 3 for ln in after), "trained again at full size"
    took = min(ln.seen for ln in after) - max(ln.seen for ln in stalled)
    # Reported, not asserted (timing depends on load): issue 28 targets the timeout + 5 s.
    print(f"STALL: last step before the hang -> first step after it: {took:.1f} s "
          f"(hangTimeoutSeconds {TIMEOUT_S})")  # fmt: skip
    status = get_job(cluster, namespace, name)["status"]
    failure = status["lastFailure"]
    assert failure["reason"] == "Hang" and failure["rank"] == 1, failure
    stacks = failure["stacks"]
    assert stacks[0]["rank"] == 1 and {s["rank"] for s in stacks} == {0, 1, 2}, stacks
    assert failure["pod"] == stacks[0]["pod"] and failure["pod"].startswith(f"{name}-worker-")
    assert "stalled_in_user_code" in stacks[0]["stack"] and not stacks[0]["waiting"], stacks[0]
    assert all(s["waiting"] for s in stacks[1:]), stacks
    assert status["restarts"] == 1, status
    wait_event(cluster, namespace, name, "HangDetected")
    assert checkpoint_step(ckpt_dir) == steps


@pytest.mark.usefixtures("operator_proc")
def test_a_declared_evaluation_longer_than_the_timeout_is_left_alone(
    cluster: Cluster, namespace: str, ckpt_dir: Path
) -> None:
    name, steps = "evaluate", 30
    env = (("EVAL_AT", "10"), ("EVAL_SECONDS", str(TIMEOUT_S * 2)))
    job = hang_job(name, ckpt_dir, steps, env)
    apply(cluster, namespace, with_hang_timeout(job.manifest()))
    wait_phase(cluster, namespace, name, "Succeeded", 300)
    status = get_job(cluster, namespace, name)["status"]
    assert status.get("restarts", 0) == 0, status
    assert "lastFailure" not in status, status
    assert "HangDetected" not in event_reasons(cluster, namespace, name)
    assert checkpoint_step(ckpt_dir) == steps


@pytest.mark.usefixtures("operator_proc")
def test_a_slow_node_is_named_and_with_the_policy_the_job_goes_on_without_it(
    cluster: Cluster, namespace: str, ckpt_dir: Path, follower: LogFollower
) -> None:
    assert throttle.available() is None, throttle.available()
    name, steps = "slow", 4000
    job = TrainingJob(
        name,
        ckpt_dir,
        min_replicas=2,
        max_replicas=3,
        steps=steps,
        step_time_s=0.0,
        ckpt_every=200,
        script="tests/e2e/stall_train.py",
        extra_env=(("WIDTH", "384"),),
    )
    manifest = job.manifest()
    manifest["spec"]["stragglerPolicy"] = "Replace"
    apply(cluster, namespace, manifest)
    wait_for(lambda: any(ln.world == 3 for ln in follower.lines("step")), 300, "world 3")
    victim = f"{name}-worker-1"
    tree = records.pod_tree(records.find(cluster.layout.pods, namespace, victim))
    with throttle.throttled([p.pid for p in tree], cpus=0.1):
        wait_event(cluster, namespace, name, "StragglerReplaced", 240)
        status = get_job(cluster, namespace, name)["status"]
        replaced_at = max(ln.seen for ln in follower.lines("step"))
    # status.stragglers lists the current round's: the group re-formed without the pod at
    # once, so the Events (with its time and ratio) and avoidedNodes are what remains.
    assert "StragglerDetected" in event_reasons(cluster, namespace, name)
    assert status["avoidedNodes"] == [PROCESS_NODE], status
    # The group re-forms without it and trains on at world 2.
    wait_for(
        lambda: any(ln.world == 2 and ln.seen > replaced_at for ln in follower.lines("step")),
        120,
        "training at world 2 after the straggler left",
    )
    wait_phase(cluster, namespace, name, "Succeeded", 400)
    assert checkpoint_step(ckpt_dir) == steps
