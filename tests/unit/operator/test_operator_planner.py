"""Table tests of the pure planner: every decision, no API."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from tests.unit.operator.factories import (
    ALL_SERVICES,
    NAME,
    NOW,
    ago,
    decided,
    job,
    observed,
    parsed,
    store,
    worker,
    written,
)
from torchflex_contract import labels
from torchflex_contract.exit_codes import SIGKILL_EXIT, ExitCode
from torchflex_contract.labels import PodKind as Role
from torchflex_operator.model.observed import Observed, PodView
from torchflex_operator.model.plan import Plan
from torchflex_operator.model.settings import Settings
from torchflex_operator.model.status import JobStatus
from torchflex_operator.model.vocabulary import EventReason, Phase, Reason
from torchflex_operator.planning import plan
from torchflex_operator.planning.rules.pacing import backoff_delay

RUNNING: dict[str, Any] = {"phase": "Running", "startTime": ago(10), "desiredReplicas": 4}


def created_indices(result: Plan) -> list[int]:
    return sorted(
        int(p["metadata"]["labels"][labels.Label.REPLICA_INDEX])
        for p in result.create_pods
        if p["metadata"]["labels"][labels.Label.ROLE] == Role.WORKER
    )


def deleted(result: Plan) -> list[str]:
    return sorted(d.name for d in result.delete_pods)


def reasons(result: Plan) -> list[EventReason]:
    return [e.reason for e in result.events]


def wn(i: int) -> str:
    return labels.worker_pod_name(NAME, i)


# --- creation and scaling -------------------------------------------------------


def test_new_job_creates_max_workers_store_and_services() -> None:
    result = plan(job(), JobStatus(), Observed(), NOW)
    assert created_indices(result) == [0, 1, 2, 3]
    roles = [p["metadata"]["labels"][labels.Label.ROLE] for p in result.create_pods]
    assert roles.count(Role.STORE) == 1
    assert {s["metadata"]["name"] for s in result.create_services} == set(ALL_SERVICES)
    assert written(result)["phase"] == Phase.PENDING
    assert written(result)["desiredReplicas"] == 4
    assert written(result)["selector"] == labels.worker_selector(NAME)
    assert EventReason.STORE_CREATED in reasons(result)


def test_etcd_backend_has_no_store_pod_or_service() -> None:
    j = job(rendezvous={"backend": "etcd", "endpoint": "http://etcd:2379"})
    result = plan(j, JobStatus(), Observed(), NOW)
    assert all(
        p["metadata"]["labels"][labels.Label.ROLE] == Role.WORKER for p in result.create_pods
    )
    assert [s["metadata"]["name"] for s in result.create_services] == [
        labels.workers_service_name(NAME)
    ]


def test_managed_etcd_creates_etcd_pod_and_service() -> None:
    j = job(rendezvous={"backend": "etcd", "managedEtcd": True})
    result = plan(j, JobStatus(), Observed(), NOW)
    names = {p["metadata"]["name"] for p in result.create_pods}
    assert labels.etcd_pod_name(NAME) in names
    assert labels.etcd_service_name(NAME) in {s["metadata"]["name"] for s in result.create_services}


@pytest.mark.parametrize(
    ("replicas", "existing", "expected"),
    [
        (None, [], [0, 1, 2, 3]),  # absent replicas means max
        (2, [], [0, 1]),
        (3, [0, 1], [2]),
        (4, [0, 2], [1, 3]),  # fill holes with the lowest free indices
        (2, [0, 1], []),
    ],
)
def test_scale_up_fills_lowest_free_indices(
    replicas: int | None, existing: list[int], expected: list[int]
) -> None:
    spec = {} if replicas is None else {"replicas": replicas}
    result = plan(job(**spec), parsed(RUNNING), observed(*(worker(i) for i in existing)), NOW)
    assert created_indices(result) == expected


def test_desired_is_clamped_to_min_and_max() -> None:
    assert job(replicas=9).desired == 4
    assert job(replicas=1).desired == 2
    assert job().desired == 4


def test_scale_down_removes_pending_first_then_highest_index() -> None:
    pods = [worker(0), worker(1), worker(2, "Pending"), worker(3)]
    result = plan(job(replicas=2), parsed(RUNNING), observed(*pods), NOW)
    assert deleted(result) == [wn(2), wn(3)]
    assert not result.create_pods
    assert all(not d.force for d in result.delete_pods)  # graceful
    assert EventReason.SCALED_DOWN in reasons(result)


def test_scale_down_prefers_highest_pending() -> None:
    pods = [worker(0, "Pending"), worker(1), worker(2), worker(3, "Pending")]
    result = plan(job(replicas=3), parsed(RUNNING), observed(*pods), NOW)
    assert deleted(result) == [wn(3)]


def test_scale_up_event_on_desired_change() -> None:
    status = {**RUNNING, "desiredReplicas": 2}
    result = plan(job(replicas=3), parsed(status), observed(worker(0), worker(1)), NOW)
    assert EventReason.SCALED_UP in reasons(result)
    assert created_indices(result) == [2]


def test_pending_pods_do_not_block_running() -> None:
    pods = [worker(0), worker(1), worker(2, "Pending"), worker(3, "Pending")]
    result = plan(job(), parsed(RUNNING), observed(*pods), NOW)
    assert written(result)["phase"] == Phase.RUNNING
    assert written(result)["replicas"] == 4
    assert written(result)["readyReplicas"] == 2
    assert not result.create_pods and not result.delete_pods


def test_never_more_than_max_worker_objects() -> None:
    # Two terminating pods still hold their slots: only the free ones may be created.
    pods = [
        worker(0),
        worker(1, deletion=NOW),
        worker(2, deletion=NOW),
    ]
    result = plan(job(), parsed(RUNNING), observed(*pods), NOW)
    assert created_indices(result) == [3]


def test_terminating_index_is_never_reused() -> None:
    pods = [worker(i) for i in (0, 2, 3)] + [worker(1, deletion=NOW)]
    result = plan(job(), parsed(RUNNING), observed(*pods), NOW)
    assert created_indices(result) == []


@pytest.mark.parametrize("replicas", [2, 3, 4])
@pytest.mark.parametrize("existing", [[], [0], [1, 3], [0, 1, 2, 3]])
def test_invariants_max_and_unique_indices(replicas: int, existing: list[int]) -> None:
    pods = [worker(i) for i in existing]
    result = plan(job(replicas=replicas), parsed(RUNNING), observed(*pods), NOW)
    new = created_indices(result)
    assert len(set(new)) == len(new)
    assert not set(new) & set(existing)
    assert len(existing) + len(new) - len(result.delete_pods) <= 4
    assert all(0 <= i < 4 for i in new)


# --- failures -------------------------------------------------------------------


def failed(index: int, code: int | None, **kw: Any) -> PodView:
    return worker(index, "Failed", exit_code=code, uid=kw.pop("uid", f"failed-{index}"), **kw)


@pytest.mark.parametrize(
    ("pod", "reason", "counted"),
    [
        (failed(1, ExitCode.USER_ERROR), Reason.USER_ERROR, True),
        (failed(1, ExitCode.USAGE), Reason.USER_ERROR, True),
        (failed(1, SIGKILL_EXIT), Reason.INFRA_ERROR, True),
        (failed(1, ExitCode.INFRA_ERROR), Reason.INFRA_ERROR, True),
        (failed(1, 137, terminated_reason="OOMKilled"), Reason.OOM_KILLED, True),
        (failed(1, ExitCode.PREEMPTED), Reason.PREEMPTED, False),
        (failed(1, 143), Reason.PREEMPTED, False),
        (failed(1, 1, disruption_reason="PreemptionByScheduler"), Reason.PREEMPTED, False),
        (failed(1, 1, disruption_reason="DeletionByTaintManager"), Reason.NODE_LOST, False),
        (failed(1, 1, disruption_reason="EvictionByEvictionAPI"), Reason.EVICTED, False),
        (failed(1, None, status_reason="Evicted"), Reason.EVICTED, False),
        (failed(1, 1, status_reason="NodeLost"), Reason.NODE_LOST, False),
        (failed(1, 1, status_reason="Shutdown"), Reason.NODE_LOST, False),
        (failed(1, 1, node_name="gone-node"), Reason.NODE_LOST, False),
    ],
)
def test_failure_reason_decides_the_budget(pod: PodView, reason: Reason, counted: bool) -> None:
    obs = observed(worker(0), pod, nodes_known=True, node_ready={"node-a": True})
    result = plan(job(), parsed(RUNNING), obs, NOW)
    assert written(result)["lastFailure"]["reason"] == reason
    assert written(result)["failures"] == (1 if counted else 0)
    assert written(result)["replacements"] == 1
    assert deleted(result) == [wn(1)]
    assert pod.uid in written(result)["accountedPods"]
    assert result.replacements == [reason]


def test_failure_counted_once_across_passes() -> None:
    pod = failed(1, 1)
    first = plan(job(), parsed(RUNNING), observed(worker(0), pod), NOW)
    second = plan(job(), decided(first), observed(worker(0), pod), NOW)
    assert written(second)["failures"] == 1
    assert EventReason.POD_FAILED not in reasons(second)


def test_accounted_uids_forgotten_when_pod_gone() -> None:
    status = {**RUNNING, "accountedPods": ["old-uid"]}
    result = plan(job(), parsed(status), observed(worker(0)), NOW)
    assert written(result)["accountedPods"] == []


def test_termination_message_becomes_last_failure_message() -> None:
    report = '{"state": "Failed", "message": "ZeroDivisionError in step 7"}'
    result = plan(job(), parsed(RUNNING), observed(worker(0), failed(1, 1, message=report)), NOW)
    assert written(result)["lastFailure"]["message"] == "ZeroDivisionError in step 7"
    assert written(result)["lastFailure"]["exitCode"] == 1


def test_backoff_limit_exceeded_fails_job_and_keeps_failed_pod() -> None:
    status = {**RUNNING, "failures": 1}
    result = plan(job(backoffLimit=1), parsed(status), observed(worker(0), failed(1, 1)), NOW)
    assert written(result)["phase"] == Phase.FAILED
    failed_cond = [c for c in written(result)["conditions"] if c["type"] == "Failed"]
    assert failed_cond[0]["reason"] == Reason.BACKOFF_LIMIT_EXCEEDED
    # cleanPodPolicy Running: running pods and the store go, the failed pod stays for logs.
    assert deleted(result) == sorted([wn(0), labels.store_pod_name(NAME)])
    assert not result.create_pods
    assert EventReason.FAILED in reasons(result)


def test_preemptions_never_exhaust_backoff_limit() -> None:
    status = parsed(RUNNING)
    for n in range(5):
        pod = failed(1, ExitCode.PREEMPTED, uid=f"p{n}")
        status = decided(plan(job(backoffLimit=0), status, observed(worker(0), pod), NOW))
    assert status.to_manifest()["phase"] != Phase.FAILED
    assert status.to_manifest()["replacements"] == 5
    assert status.to_manifest()["failures"] == 0


# --- backoff --------------------------------------------------------------------


def test_backoff_delay_is_exponential_and_capped() -> None:
    s = Settings(backoff_base_s=1, backoff_cap_s=10)
    assert [backoff_delay(n, s) for n in range(6)] == [0, 1, 2, 4, 8, 10]


def test_replacement_waits_for_backoff() -> None:
    s = Settings(backoff_base_s=4, backoff_cap_s=60)
    status = {**RUNNING, "replacementStreak": 1, "lastReplacementTime": ago(1)}
    first = plan(
        job(), parsed(status), observed(worker(0), worker(2), worker(3), failed(1, 1)), NOW, s
    )
    assert written(first)["replacementStreak"] == 2
    assert written(first)["backoffUntil"] == ago(-8)
    assert EventReason.BACKING_OFF in reasons(first)
    # Next pass: the failed pod is gone, but the backoff has not expired.
    later = NOW + dt.timedelta(seconds=3)
    second = plan(job(), decided(first), observed(worker(0), worker(2), worker(3)), later, s)
    assert created_indices(second) == []
    assert second.requeue_after == pytest.approx(5)
    after = NOW + dt.timedelta(seconds=8)
    third = plan(job(), decided(first), observed(worker(0), worker(2), worker(3)), after, s)
    assert created_indices(third) == [1]


def test_backoff_streak_resets_after_quiet_period() -> None:
    s = Settings(backoff_base_s=1, backoff_cap_s=10)
    status = {**RUNNING, "replacementStreak": 5, "lastReplacementTime": ago(300)}
    result = plan(job(), parsed(status), observed(worker(0), failed(1, 1)), NOW, s)
    assert written(result)["replacementStreak"] == 1


# --- availability, deadline, completion -----------------------------------------


def test_below_min_sets_condition_and_requeues_for_timeout() -> None:
    j = job(minAvailableTimeoutSeconds=60)
    s = Settings(resync_s=1000)
    result = plan(j, parsed(RUNNING), observed(worker(0), worker(1, "Pending")), NOW, s)
    assert written(result)["phase"] == Phase.RESTARTING
    assert written(result)["belowMinSince"] == ago(0)
    cond = next(c for c in written(result)["conditions"] if c["type"] == "MinAvailable")
    assert (cond["status"], cond["reason"]) == ("False", Reason.BELOW_MIN_REPLICAS)
    assert result.requeue_after == pytest.approx(60)


def test_below_min_too_long_fails() -> None:
    j = job(minAvailableTimeoutSeconds=60)
    status = {**RUNNING, "belowMinSince": ago(61)}
    result = plan(j, parsed(status), observed(worker(0), worker(1, "Pending")), NOW)
    assert written(result)["phase"] == Phase.FAILED
    cond = next(c for c in written(result)["conditions"] if c["type"] == "Failed")
    assert cond["reason"] == Reason.MIN_AVAILABLE_TIMEOUT
    assert "minAvailableTimeoutSeconds=60" in cond["message"]
    assert not result.create_pods


def test_back_above_min_clears_timer() -> None:
    status = {**RUNNING, "phase": "Restarting", "belowMinSince": ago(30)}
    result = plan(job(), parsed(status), observed(worker(0), worker(1)), NOW)
    assert "belowMinSince" not in written(result)
    assert written(result)["phase"] == Phase.RUNNING


def test_new_job_below_min_is_pending() -> None:
    result = plan(job(), JobStatus(), observed(worker(0, "Pending")), NOW)
    assert written(result)["phase"] == Phase.PENDING


def test_active_deadline() -> None:
    status = {**RUNNING, "startTime": ago(100)}
    result = plan(
        job(activeDeadlineSeconds=50), parsed(status), observed(worker(0), worker(1)), NOW
    )
    assert written(result)["phase"] == Phase.FAILED
    failed = next(c for c in written(result)["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == Reason.DEADLINE_EXCEEDED
    ok = plan(job(activeDeadlineSeconds=500), parsed(status), observed(worker(0), worker(1)), NOW)
    assert written(ok)["phase"] == Phase.RUNNING
    assert ok.requeue_after is not None and ok.requeue_after <= 400


def test_worker_success_without_agent_reports_waits_for_every_running_pod() -> None:
    # torchrun's rule when no agent report says who was in the final round.
    pods = [worker(0, "Succeeded", exit_code=0), worker(1), worker(2, "Pending", node_name=None)]
    result = plan(job(), parsed(RUNNING), observed(*pods), NOW)
    assert written(result)["phase"] == Phase.RUNNING
    assert deleted(result) == [wn(2)]  # never reached a node: cannot be a member
    assert not result.create_pods
    assert EventReason.COMPLETING in reasons(result)
    done = [worker(0, "Succeeded", exit_code=0), worker(1, "Succeeded", exit_code=0)]
    result = plan(job(), decided(result), observed(*done), NOW)
    assert written(result)["phase"] == Phase.SUCCEEDED
    assert written(result)["completionTime"] == ago(0)
    assert deleted(result) == [labels.store_pod_name(NAME)]
    assert EventReason.SUCCEEDED in reasons(result)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("All", [wn(0), wn(1), labels.store_pod_name(NAME)]),
        ("Running", [wn(1), labels.store_pod_name(NAME)]),
        ("None", []),
    ],
)
def test_clean_pod_policy(policy: str, expected: list[str]) -> None:
    status = {**RUNNING, "phase": "Succeeded", "completionTime": ago(1)}
    pods = [worker(0, "Succeeded"), worker(1)]
    result = plan(job(cleanPodPolicy=policy), parsed(status), observed(*pods), NOW)
    assert deleted(result) == sorted(expected)
    assert written(result)["phase"] == Phase.SUCCEEDED


def test_ttl_after_finished() -> None:
    status = {"phase": "Succeeded", "completionTime": ago(30)}
    waiting = plan(job(ttlSecondsAfterFinished=100), parsed(status), observed(), NOW)
    assert not waiting.delete_job
    assert waiting.requeue_after == pytest.approx(70)
    expired = plan(job(ttlSecondsAfterFinished=10), parsed(status), observed(), NOW)
    assert expired.delete_job
    assert EventReason.TTL_EXPIRED in reasons(expired)


def test_finished_job_without_ttl_does_not_requeue() -> None:
    status = {"phase": "Failed", "completionTime": ago(30)}
    assert plan(job(), parsed(status), observed(), NOW).requeue_after is None


# --- suspend --------------------------------------------------------------------


def test_suspend_deletes_all_pods_and_keeps_job() -> None:
    pods = [worker(0), worker(1, "Pending"), worker(2, deletion=NOW)]
    result = plan(job(suspend=True), parsed(RUNNING), observed(*pods), NOW)
    assert deleted(result) == sorted([wn(0), wn(1), labels.store_pod_name(NAME)])
    assert written(result)["phase"] == Phase.SUSPENDED
    assert "startTime" not in written(result)
    assert not result.create_pods and not result.delete_job
    assert EventReason.SUSPENDED in reasons(result)


def test_resume_recreates_pods_and_restarts_clock() -> None:
    status = {"phase": "Suspended", "desiredReplicas": 4}
    result = plan(job(), parsed(status), Observed(services=ALL_SERVICES), NOW)
    assert created_indices(result) == [0, 1, 2, 3]
    assert written(result)["startTime"] == ago(0)
    assert EventReason.RESUMED in reasons(result)
    cond = next(c for c in written(result)["conditions"] if c["type"] == "Suspended")
    assert cond["status"] == "False"


# --- rendezvous host, node loss, steady state ---------------------------------------


def test_lost_store_is_recreated_with_event() -> None:
    status = {**RUNNING, "rendezvousHost": labels.store_pod_name(NAME)}
    obs = Observed(pods=(worker(0), worker(1)), services=ALL_SERVICES)
    result = plan(job(replicas=2), parsed(status), obs, NOW)
    assert labels.store_pod_name(NAME) in {p["metadata"]["name"] for p in result.create_pods}
    assert EventReason.RENDEZVOUS_HOST_LOST in reasons(result)


def test_failed_store_is_deleted_for_recreation() -> None:
    obs = observed(worker(0), worker(1), store("Failed"))
    result = plan(job(replicas=2), parsed(RUNNING), obs, NOW)
    assert deleted(result) == [labels.store_pod_name(NAME)]


def test_pod_stuck_terminating_on_lost_node_is_force_deleted() -> None:
    s = Settings(force_delete_after_s=30)
    stuck = worker(1, deletion=NOW - dt.timedelta(seconds=31), node_name="dead")
    obs = observed(worker(0), stuck, nodes_known=True, node_ready={"node-a": True})
    result = plan(job(replicas=2), parsed(RUNNING), obs, NOW, s)
    assert [(d.name, d.force) for d in result.delete_pods] == [(wn(1), True)]
    assert EventReason.FORCE_DELETED in reasons(result)
    young = worker(1, deletion=NOW - dt.timedelta(seconds=10), node_name="dead")
    obs = observed(worker(0), young, nodes_known=True, node_ready={"node-a": True})
    waiting = plan(job(replicas=2), parsed(RUNNING), obs, NOW, s)
    assert not waiting.delete_pods
    assert waiting.requeue_after == pytest.approx(20)


def test_terminating_pod_on_healthy_node_is_left_alone() -> None:
    old = worker(1, deletion=NOW - dt.timedelta(seconds=300))
    obs = observed(worker(0), old, nodes_known=True, node_ready={"node-a": True})
    assert not plan(job(replicas=2), parsed(RUNNING), obs, NOW).delete_pods


def test_steady_state_is_a_fixed_point() -> None:
    pods = [worker(i) for i in range(4)]
    first = plan(job(), parsed(RUNNING), observed(*pods), NOW)
    second = plan(job(), decided(first), observed(*pods), NOW + dt.timedelta(seconds=5))
    assert written(second) == written(first)
    assert not second.events and not second.create_pods and not second.delete_pods


def test_agent_reports_fill_world_size_and_round() -> None:
    from torchflex_contract.progress import AgentReport, AgentState

    reports = {
        wn(0): AgentReport(AgentState.RUNNING, round=3, world_size=8, restarts=1),
        wn(1): AgentReport(AgentState.RUNNING, round=2, world_size=4, restarts=2),
    }
    result = plan(job(), parsed(RUNNING), observed(worker(0), worker(1), reports=reports), NOW)
    assert (written(result)["rendezvousRound"], written(result)["worldSize"]) == (3, 8)
    assert written(result)["restarts"] == 2


def test_deleting_job_plans_nothing() -> None:
    obj_job = job()
    import dataclasses

    deleting = dataclasses.replace(obj_job, deleting=True)
    result = plan(deleting, parsed(RUNNING), observed(), NOW)
    assert not result.create_pods and not result.delete_pods and not written(result)
