"""Table tests of the planner's rolling update, deleted-pod handling and lost-node rules."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest

from tests.unit.operator.factories import (
    NAME,
    NOW,
    ago,
    job,
    observed,
    parsed,
    store,
    worker,
    written,
)
from torchflex_contract import labels
from torchflex_contract.exit_codes import SIGKILL_EXIT
from torchflex_operator.model.observed import PodView
from torchflex_operator.model.plan import Plan
from torchflex_operator.model.settings import Settings
from torchflex_operator.model.vocabulary import EventReason, Phase, Reason
from torchflex_operator.planning import plan
from torchflex_operator.render import builders

RUNNING: dict[str, Any] = {"phase": "Running", "startTime": ago(10), "desiredReplicas": 4}
OLD = "0ld0ld0ld0ld0ld0"


def wn(i: int) -> str:
    return labels.worker_pod_name(NAME, i)


def deleted(result: Plan) -> list[str]:
    return sorted(d.name for d in result.delete_pods)


def reasons(result: Plan) -> list[EventReason]:
    return [e.reason for e in result.events]


def current() -> str:
    return builders.template_hash(job())


def at(i: int, phase: str = "Running", *, old: bool = False, **kw: Any) -> PodView:
    return worker(i, phase, spec_hash=OLD if old else current(), **kw)


# --- rolling update ---------------------------------------------------------------


def test_spec_hash_covers_baked_fields_not_replicas() -> None:
    base = builders.template_hash(job())
    assert builders.template_hash(job(replicas=3)) == base
    assert builders.template_hash(job(maxReplicas=5)) != base
    assert builders.template_hash(job(maxRestarts=7)) != base
    changed = job().template["spec"]["containers"][0] | {"command": ["python", "other.py"]}
    assert builders.template_hash(job(template={"spec": {"containers": [changed]}})) != base
    pod = builders.worker_pod(job(), 0, Settings())
    assert PodView.from_pod(pod).spec_hash == base


def test_up_to_date_job_does_not_roll() -> None:
    result = plan(job(), parsed(RUNNING), observed(*(at(i) for i in range(4))), NOW)
    assert not result.delete_pods
    assert written(result)["updatedReplicas"] == 4


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        # Running outdated pods go one at a time, highest index first.
        ([at(0, old=True), at(1, old=True), at(2, old=True), at(3, old=True)], [wn(3)]),
        # Pending outdated pods hold no training state: all at once, no running one yet.
        (
            [
                at(0, old=True),
                at(1, old=True),
                at(2, "Pending", old=True),
                at(3, "Pending", old=True),
            ],
            [wn(2), wn(3)],
        ),
        # The previous replacement is not running yet: wait.
        ([at(0, old=True), at(1, old=True), at(2, old=True), at(3, "Pending")], []),
        # The previous victim is still terminating: wait.
        ([at(0, old=True), at(1, old=True), at(2), at(3, deletion=NOW, old=True)], []),
        # Its replacement not created yet (fewer than desired): wait.
        ([at(0, old=True), at(1, old=True), at(2)], []),
        # Mixed: only the outdated ones, highest first.
        ([at(0, old=True), at(1), at(2, old=True), at(3)], [wn(2)]),
    ],
)
def test_rolling_update_one_at_a_time(pods: list[PodView], expected: list[str]) -> None:
    result = plan(job(), parsed(RUNNING), observed(*pods), NOW)
    assert deleted(result) == expected
    assert all(not d.force for d in result.delete_pods)
    if expected:
        assert EventReason.ROLLING_UPDATE in reasons(result)
    outdated = sum(1 for p in pods if p.spec_hash == OLD and p.active)
    assert written(result)["updatedReplicas"] == sum(1 for p in pods if p.active) - outdated


def test_rolling_waits_for_backoff_and_for_failures() -> None:
    pods = [at(i, old=True) for i in range(4)]
    backing_off = {**RUNNING, "backoffUntil": ago(-5)}
    assert not plan(job(), parsed(backing_off), observed(*pods), NOW).delete_pods
    failed = dataclasses.replace(at(3, "Failed", old=True), exit_code=1)
    result = plan(job(), parsed(RUNNING), observed(*pods[:3], failed), NOW)
    assert deleted(result) == [wn(3)]  # the failed pod only, no rolling victim on top


def test_scale_down_prefers_outdated_pods() -> None:
    pods = [at(0), at(1, old=True), at(2), at(3)]
    result = plan(job(replicas=3), parsed(RUNNING), observed(*pods), NOW)
    assert deleted(result) == [wn(1)]


def test_rolled_pod_that_exits_is_neither_failure_nor_success() -> None:
    gone = dataclasses.replace(at(3, "Failed", deletion=NOW, old=True), exit_code=SIGKILL_EXIT)
    result = plan(job(), parsed(RUNNING), observed(at(0), at(1), at(2), gone), NOW)
    assert written(result)["failures"] == 0 and written(result)["replacements"] == 0
    assert gone.uid in written(result)["accountedPods"]
    assert "lastFailure" not in written(result)
    assert EventReason.POD_FAILED not in reasons(result)
    assert EventReason.BACKING_OFF not in reasons(result)
    exited0 = dataclasses.replace(at(3, "Succeeded", deletion=NOW), exit_code=0)
    done = plan(job(), parsed(RUNNING), observed(at(0), at(1), at(2), exited0), NOW)
    assert written(done)["phase"] == Phase.RUNNING


# --- pods stuck terminating on a lost node -------------------------------------------


@pytest.mark.parametrize(
    ("node_ready", "stuck_for", "forced", "wake"),
    [
        ({"node-a": True}, 31, True, None),  # node gone
        ({"node-a": True, "dead": False}, 31, True, None),  # node NotReady
        ({"node-a": True, "dead": False}, 10, False, 20),  # not yet: wake when due
        ({"node-a": True, "dead": True}, 300, False, None),  # node healthy: kubelet's job
    ],
)
def test_stuck_terminating_pod_is_force_deleted_after_bounded_wait(
    node_ready: dict[str, bool], stuck_for: int, forced: bool, wake: float | None
) -> None:
    s = Settings(force_delete_after_s=30, resync_s=1000)
    stuck = worker(1, deletion=NOW - dt.timedelta(seconds=stuck_for), node_name="dead")
    obs = observed(worker(0), stuck, nodes_known=True, node_ready=node_ready)
    result = plan(job(replicas=2, maxReplicas=2), parsed(RUNNING), obs, NOW, s)
    assert [(d.name, d.force) for d in result.delete_pods] == ([(wn(1), True)] if forced else [])
    assert (EventReason.FORCE_DELETED in reasons(result)) == forced
    if wake is not None:
        assert result.requeue_after == pytest.approx(wake)
    # The stuck pod still holds its index: no second worker-1, nothing counted.
    assert not result.create_pods
    assert written(result)["failures"] == 0


def test_node_health_unknown_never_forces() -> None:
    stuck = worker(1, deletion=NOW - dt.timedelta(seconds=600), node_name="dead")
    result = plan(
        job(replicas=2), parsed(RUNNING), observed(worker(0), stuck, nodes_known=False), NOW
    )
    assert not result.delete_pods


def test_force_deleted_pod_is_recreated_and_not_counted() -> None:
    # After the force delete the pod is simply gone: its index is refilled at once.
    status = {**RUNNING, "desiredReplicas": 2}
    obs = observed(worker(0), nodes_known=True, node_ready={"node-a": True})
    result = plan(job(replicas=2, maxReplicas=2), parsed(status), obs, NOW)
    assert [p["metadata"]["name"] for p in result.create_pods] == [wn(1)]
    assert written(result)["failures"] == 0 and written(result)["replacements"] == 0


def test_stuck_store_pod_is_forced_too() -> None:
    stuck = store(deletion=NOW - dt.timedelta(seconds=60), node_name="dead")
    obs = observed(worker(0), worker(1), stuck, nodes_known=True, node_ready={"node-a": True})
    result = plan(job(replicas=2), parsed(RUNNING), obs, NOW, Settings(force_delete_after_s=5))
    assert [(d.name, d.force) for d in result.delete_pods] == [(labels.store_pod_name(NAME), True)]


# --- suspend, deadline, availability timers --------------------------------------------


def test_suspended_job_ignores_deadline_and_min_available() -> None:
    status = {"phase": "Suspended", "desiredReplicas": 4}
    result = plan(
        job(suspend=True, activeDeadlineSeconds=1, minAvailableTimeoutSeconds=1),
        parsed(status),
        observed(),
        NOW,
    )
    assert written(result)["phase"] == Phase.SUSPENDED
    assert not result.events  # already suspended: nothing new to say
    assert not result.create_pods


def test_min_available_timeout_event_says_why() -> None:
    j = job(minAvailableTimeoutSeconds=5)
    status = {**RUNNING, "belowMinSince": ago(6)}
    result = plan(j, parsed(status), observed(worker(0, "Pending"), worker(1, "Pending")), NOW)
    failed = [e for e in result.events if e.reason is EventReason.FAILED]
    assert failed and Reason.MIN_AVAILABLE_TIMEOUT.value in failed[0].message
    assert "0 of minimum 2 workers running" in failed[0].message


def test_deadline_event_and_condition() -> None:
    status = {**RUNNING, "startTime": ago(5)}
    result = plan(job(activeDeadlineSeconds=5), parsed(status), observed(worker(0), worker(1)), NOW)
    cond = next(c for c in written(result)["conditions"] if c["type"] == "Failed")
    assert (cond["status"], cond["reason"]) == ("True", Reason.DEADLINE_EXCEEDED)
    assert any(
        e.reason is EventReason.FAILED and "activeDeadlineSeconds=5" in e.message
        for e in result.events
    )
    assert written(result)["completionTime"] == ago(0)


def test_idle_job_requeues_at_the_slow_resync() -> None:
    pods = [at(i) for i in range(4)]
    result = plan(job(), parsed(RUNNING), observed(*pods), NOW, Settings(resync_s=300))
    assert result.requeue_after == pytest.approx(300)
