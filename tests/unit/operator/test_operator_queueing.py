"""Kueue admission, the pure parts: the Workload, what it allows, and what is written back.

Tables for ``queueing`` (the Workload manifest, ``gate``, ``workload_action``,
the release and finish patches) and for the planner holding, running and
suspending a queued job. Real Kueue is exercised in tests/e2e/test_kueue.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tests.unit.operator.factories import NAME, NOW, NS, job_obj, observed, parsed, worker
from torchflex_operator.model.kueue import Admission, WorkloadView
from torchflex_operator.model.settings import Settings
from torchflex_operator.model.spec import JobSpec
from torchflex_operator.model.vocabulary import EventReason, KueueLabel, Phase
from torchflex_operator.planning import plan
from torchflex_operator.render import workload as queueing
from torchflex_operator.render.workload import WorkloadAction

QUEUE = "team-a"


def queued(priority: str | None = None, **spec: Any) -> JobSpec:
    obj = job_obj(**spec)
    labels = {KueueLabel.QUEUE_NAME.value: QUEUE}
    if priority is not None:
        labels[KueueLabel.PRIORITY_CLASS.value] = priority
    obj["metadata"]["labels"] = labels
    return JobSpec.parse(obj)


def cond(ctype: str, status: str = "True", reason: str = "R", message: str = "") -> dict[str, Any]:
    return {"type": ctype, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": "2025-01-01T11:00:00Z"}  # fmt: skip


def workload_obj(
    *conds: dict[str, Any], count: int | None = None, asked: tuple[int, int] = (4, 2)
) -> dict[str, Any]:
    """A Workload of ``queued()`` (2-4 workers) unless ``asked`` says other (count, minCount)."""
    status: dict[str, Any] = {"conditions": list(conds)}
    if count is not None:
        status["admission"] = {
            "clusterQueue": "cq",
            "podSetAssignments": [{"name": queueing.POD_SET, "count": count}],
        }
    pod_set = {"name": queueing.POD_SET, "count": asked[0], "minCount": asked[1]}
    return {"metadata": {"name": f"elasticjob-{NAME}", "namespace": NS, "uid": "w",
                         "resourceVersion": "7", "generation": 1},
            "spec": {"podSets": [pod_set]}, "status": status}  # fmt: skip


ADMITTED = (cond("QuotaReserved"), cond("Admitted"))
PREEMPTED = (*ADMITTED, cond("Evicted", reason="Preempted", message="Preempted by a higher one"))


def view(
    *conds: dict[str, Any], count: int | None = None, asked: tuple[int, int] = (4, 2)
) -> WorkloadView:
    return WorkloadView.parse(workload_obj(*conds, count=count, asked=asked))


RELEASED = view(cond("QuotaReserved", "False"), cond("Evicted"))


def test_labels_are_read_from_the_job() -> None:
    spec = queued("high")
    assert (spec.queue_name, spec.priority_class) == (QUEUE, "high")
    assert JobSpec.parse(job_obj()).queue_name is None


@pytest.mark.parametrize(("priority_class", "value"), [(None, None), ("high", 1000)])
def test_workload_is_one_pod_set_of_max_with_min_count_owned_by_the_job(
    priority_class: str | None, value: int | None
) -> None:
    spec = queued(priority_class, minReplicas=2, maxReplicas=5)
    wl = queueing.workload(spec, value)
    assert (wl["apiVersion"], wl["kind"]) == ("kueue.x-k8s.io/v1beta2", "Workload")
    assert wl["metadata"]["name"] == queueing.workload_name(spec) == f"elasticjob-{NAME}"
    (owner,) = wl["metadata"]["ownerReferences"]
    assert (owner["name"], owner["uid"], owner["controller"]) == (NAME, spec.uid, True)
    (pod_set,) = wl["spec"]["podSets"]
    assert (pod_set["name"], pod_set["count"], pod_set["minCount"]) == ("workers", 5, 2)
    assert pod_set["template"] == spec.template
    assert wl["spec"]["queueName"] == QUEUE
    if value is None:
        assert "priority" not in wl["spec"] and "priorityClassRef" not in wl["spec"]
    else:
        assert wl["spec"]["priority"] == value
        assert wl["spec"]["priorityClassRef"] == {
            "group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": "high"}  # fmt: skip


@pytest.mark.parametrize(
    ("wl", "admission", "count"),
    [
        (None, Admission.WAITING, 0),
        (view(), Admission.WAITING, 0),
        (view(cond("QuotaReserved", "False", "Pending", "no room")), Admission.WAITING, 0),
        (view(*ADMITTED, count=3), Admission.ADMITTED, 3),
        (view(*ADMITTED), Admission.ADMITTED, 4),  # no count: admitted whole
        # Never stretched to fit: more pods than admitted would run on no quota.
        (view(*ADMITTED, count=9), Admission.WAITING, 0),
        (view(*ADMITTED, count=1), Admission.WAITING, 0),
        # minReplicas raised to 3 (or maxReplicas changed) after admission: replaced.
        (view(*ADMITTED, count=2, asked=(4, 1)), Admission.WAITING, 0),
        (view(*ADMITTED, count=5, asked=(5, 2)), Admission.WAITING, 0),
        (view(*PREEMPTED, count=3), Admission.EVICTED, 0),
        # Released after the eviction: waits to be admitted again.
        (RELEASED, Admission.WAITING, 0),
    ],
)
def test_gate(wl: WorkloadView | None, admission: Admission, count: int) -> None:
    g = queueing.gate(queued(), wl)
    assert g is not None
    assert (g.admission, g.count) == (admission, count)
    assert g.holds is (admission is not Admission.ADMITTED)


@pytest.mark.parametrize(
    ("wl", "age", "read"),
    [(None, 1.0, True), (view(), 1.0, True), (view(*PREEMPTED, count=3), 1.0, True),
     (RELEASED, 1.0, True), (view(*ADMITTED, count=3), 1.0, False),
     (view(*ADMITTED, count=3), 10.0, True), (view(*ADMITTED, count=3), None, True)],
)  # fmt: skip
def test_when_a_pass_reads_the_workload_from_the_api(
    wl: WorkloadView | None, age: float | None, read: bool
) -> None:
    assert queueing.must_read(queued(), wl, age, 10.0) is read


@pytest.mark.parametrize("wl", [view(), view(*ADMITTED, count=3)])
def test_a_queued_job_looks_again_soon(wl: WorkloadView) -> None:
    gate = queueing.gate(queued(), wl)
    result = plan(queued(), parsed({}), observed(queue=gate), NOW)
    assert result.requeue_after is not None
    assert result.requeue_after <= Settings().queue_poll_s


def test_a_job_without_the_label_is_not_gated() -> None:
    assert queueing.gate(JobSpec.parse(job_obj()), None) is None


@pytest.mark.parametrize(
    ("wl", "phase", "pods", "action"),
    [
        (None, None, 0, WorkloadAction.CREATE),
        (None, Phase.SUCCEEDED, 0, WorkloadAction.NONE),
        (view(), Phase.PENDING, 0, WorkloadAction.NONE),
        (view(*ADMITTED, count=3), Phase.RUNNING, 3, WorkloadAction.NONE),
        (view(*PREEMPTED, count=3), Phase.SUSPENDED, 2, WorkloadAction.NONE),  # still stopping
        (view(*PREEMPTED, count=3), Phase.SUSPENDED, 0, WorkloadAction.RELEASE),
        (RELEASED, Phase.SUSPENDED, 0, WorkloadAction.NONE),  # released: Kueue's turn
        (view(*ADMITTED, count=3), Phase.SUCCEEDED, 0, WorkloadAction.FINISH),
        (view(*ADMITTED, count=3), Phase.FAILED, 1, WorkloadAction.FINISH),
        (view(*ADMITTED, cond("Finished")), Phase.SUCCEEDED, 0, WorkloadAction.NONE),
        # Replicas changed since it was created: deleted once no pod is left, then anew.
        (view(*ADMITTED, count=2, asked=(4, 1)), Phase.RUNNING, 2, WorkloadAction.NONE),
        (view(*ADMITTED, count=2, asked=(4, 1)), Phase.SUSPENDED, 0, WorkloadAction.DELETE),
        (view(asked=(5, 2)), Phase.SUSPENDED, 0, WorkloadAction.DELETE),
    ],
)
def test_workload_action(
    wl: WorkloadView | None, phase: Phase | None, pods: int, action: WorkloadAction
) -> None:
    assert queueing.workload_action(queued(), wl, phase, pods) is action


def test_no_action_for_a_job_without_the_label() -> None:
    assert queueing.workload_action(JobSpec.parse(job_obj()), None, None, 0) is WorkloadAction.NONE


@pytest.mark.parametrize(
    ("wl", "action"),
    [
        (view(*ADMITTED, count=3), WorkloadAction.DELETE),  # its quota must not stay reserved
        (view(*ADMITTED, cond("Finished")), WorkloadAction.NONE),
    ],
)
def test_a_job_whose_queue_label_was_removed_gives_its_workload_up(
    wl: WorkloadView, action: WorkloadAction
) -> None:
    unlabelled = JobSpec.parse(job_obj())
    assert queueing.gate(unlabelled, wl) is None  # runs ungated
    assert queueing.workload_action(unlabelled, wl, Phase.RUNNING, 3) is action


def test_a_stale_workload_says_why_the_job_waits() -> None:
    g = queueing.gate(queued(), view(*ADMITTED, count=2, asked=(4, 1)))
    assert g is not None and g.holds
    assert "asked for 1-4 pods and the job now runs 2-4" in g.message


def test_a_suspended_queued_job_does_not_poll_its_workload() -> None:
    spec = dataclasses.replace(queued(), suspend=True)
    gate = queueing.gate(spec, view(*ADMITTED, count=3))
    result = plan(spec, parsed({"phase": "Suspended"}), observed(queue=gate), NOW)
    assert result.requeue_after is None or result.requeue_after > Settings().queue_poll_s


@pytest.mark.parametrize(("reason", "requeued"), [("Preempted", "True"), ("Deactivated", "False")])
def test_release_patch_gives_the_reservation_back_as_kueue_does(reason: str, requeued: str) -> None:
    wl = view(*ADMITTED, cond("Evicted", reason=reason, message="why"), count=3)
    patch = queueing.release_patch(wl, NOW)
    assert patch["admission"] is None
    by_type = {c["type"]: c for c in patch["conditions"]}
    assert by_type["QuotaReserved"]["status"] == "False"
    assert by_type["QuotaReserved"]["reason"] == "Pending"
    assert by_type["Admitted"]["status"] == "False"
    assert (by_type["Requeued"]["status"], by_type["Requeued"]["reason"]) == (requeued, reason)
    assert by_type["Evicted"] == cond("Evicted", reason=reason, message="why")  # kept as is
    assert by_type["QuotaReserved"]["lastTransitionTime"] == "2025-01-01T12:00:00Z"


def test_finished_patch() -> None:
    patch = queueing.finished_patch(view(*ADMITTED, count=3), Phase.FAILED, NOW)
    finished = next(c for c in patch["conditions"] if c["type"] == "Finished")
    assert (finished["status"], finished["reason"]) == ("True", "Failed")
    assert len(patch["conditions"]) == 3


# --- the planner with a gate -------------------------------------------------------


def test_waiting_job_creates_no_pod_and_says_why() -> None:
    gate = queueing.gate(queued(), view(cond("QuotaReserved", "False", "Pending", "no room")))
    result = plan(queued(), parsed({}), observed(queue=gate), NOW)
    assert result.create_pods == []
    assert result.status is not None and result.status.phase is Phase.SUSPENDED
    (suspended,) = [c for c in result.status.conditions or () if c.type == "Suspended"]
    assert suspended.reason == "WaitingForAdmission"
    assert "LocalQueue team-a: no room" in suspended.message
    assert [e.reason for e in result.events] == [EventReason.WAITING_FOR_ADMISSION]


def test_admitted_job_runs_at_the_admitted_count() -> None:
    gate = queueing.gate(queued(), view(*ADMITTED, count=3))
    prior = parsed({"phase": "Suspended"})
    result = plan(queued(), prior, observed(queue=gate), NOW)
    assert result.status is not None and result.status.desired_replicas == 3
    assert len([p for p in result.create_pods if "worker" in p["metadata"]["name"]]) == 3
    assert EventReason.ADMITTED in [e.reason for e in result.events]


def test_admitted_count_never_raises_spec_replicas() -> None:
    gate = queueing.gate(queued(replicas=2), view(*ADMITTED, count=4))
    result = plan(queued(replicas=2), parsed({}), observed(queue=gate), NOW)
    assert result.status is not None and result.status.desired_replicas == 2


def test_evicted_job_stops_its_pods_gracefully() -> None:
    gate = queueing.gate(queued(), view(*PREEMPTED, count=3))
    pods = [worker(i) for i in range(3)]
    result = plan(queued(), parsed({"phase": "Running"}), observed(*pods, queue=gate), NOW)
    deleted = {d.name for d in result.delete_pods}
    assert {p.name for p in pods} <= deleted
    assert all(not d.force and d.grace_s is None for d in result.delete_pods)
    assert result.status is not None and result.status.phase is Phase.SUSPENDED
    (event,) = [e for e in result.events if e.reason is EventReason.EVICTED_BY_KUEUE]
    assert "Preempted by a higher one" in event.message


def test_a_user_suspend_still_wins() -> None:
    spec = dataclasses.replace(queued(), suspend=True)
    gate = queueing.gate(spec, view(*ADMITTED, count=3))
    result = plan(spec, parsed({}), observed(worker(0), queue=gate), NOW)
    assert result.status is not None and result.status.phase is Phase.SUSPENDED
    (suspended,) = [c for c in result.status.conditions or () if c.type == "Suspended"]
    assert suspended.reason == "SuspendedByUser"
