"""Workers ended by their agents for not exiting (issue 26): status, Events, outcome.

Driven through ``planner.plan`` with the final reports agents write, plus the
pure ``hung`` rules in tables.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tests.unit.operator.factories import NAME, NOW, ago, job, observed, parsed, worker, written
from torchflex_contract import labels
from torchflex_contract.progress import AgentReport, AgentState, HangKind, HangReport
from torchflex_operator.model.plan import Plan
from torchflex_operator.model.status import HungWorker, JobStatus
from torchflex_operator.model.vocabulary import ConditionType, EventReason, Phase, Reason
from torchflex_operator.planning import plan
from torchflex_operator.planning.rules import hung

RUNNING: dict[str, Any] = {"phase": "Running", "startTime": ago(10), "desiredReplicas": 2}
STACK = 'Thread 0x1 (most recent call first):\n  File "train.py", line 9 in hang_forever\n'


def wn(i: int) -> str:
    return labels.worker_pod_name(NAME, i)


def final(rank: int, hang: HangReport | None = None, *, ok: bool = True) -> AgentReport:
    state = AgentState.SUCCEEDED if ok else AgentState.FAILED
    return AgentReport(state, round=3, world_size=2, nodes=2, node_rank=rank, hang=hang)


def teardown(rank: int = 1) -> HangReport:
    return HangReport(HangKind.TEARDOWN, rank, 31.0, 3, STACK)


def completion_hang(rank: int = 1) -> HangReport:
    return HangReport(HangKind.COMPLETION, rank, 300.4, 3, STACK)


def events(result: Plan, reason: EventReason) -> list[str]:
    return [e.message for e in result.events if e.reason == reason]


def condition(result: Plan, ctype: ConditionType) -> dict[str, Any]:
    conds: list[dict[str, Any]] = written(result)["conditions"]
    return next(c for c in conds if c["type"] == ctype)


def test_teardown_hang_succeeds_the_job_with_the_stack_in_status_and_an_event() -> None:
    pods = [worker(0, "Succeeded", exit_code=0), worker(1, "Succeeded", exit_code=0)]
    reports = {wn(0): final(0), wn(1): final(1, teardown())}
    result = plan(job(maxReplicas=2), parsed(RUNNING), observed(*pods, reports=reports), NOW)
    status = written(result)
    assert status["phase"] == Phase.SUCCEEDED
    [entry] = status["hungWorkers"]
    assert entry["pod"] == wn(1) and entry["kind"] == "Teardown" and entry["rank"] == 1
    assert entry["stack"] == STACK and entry["round"] == 3 and entry["seconds"] == 31.0
    [message] = events(result, EventReason.WORKER_HUNG)
    assert wn(1) in message and "hung in teardown" in message
    succeeded = condition(result, ConditionType.SUCCEEDED)
    assert succeeded["reason"] == Reason.WORKER_GROUP_SUCCEEDED
    assert "hung in teardown" in succeeded["message"] and wn(1) in succeeded["message"]


def test_completion_hang_fails_the_job_naming_it() -> None:
    pods = [worker(0, "Succeeded", exit_code=0), worker(1, "Failed", exit_code=1)]
    reports = {wn(0): final(0), wn(1): final(1, completion_hang(), ok=False)}
    result = plan(job(maxReplicas=2), parsed(RUNNING), observed(*pods, reports=reports), NOW)
    status = written(result)
    assert status["phase"] == Phase.FAILED
    failed = condition(result, ConditionType.FAILED)
    assert failed["reason"] == Reason.COMPLETION_HANG
    assert wn(1) in failed["message"] and "300 s" in failed["message"]
    assert status["hungWorkers"][0]["kind"] == "Completion"
    assert len(events(result, EventReason.WORKER_HUNG)) == 1


def test_a_hang_is_listed_and_announced_once() -> None:
    pods = [worker(0), worker(1, "Succeeded", exit_code=0)]
    reports = {wn(1): final(1, teardown())}
    first = plan(job(maxReplicas=2), parsed(RUNNING), observed(*pods, reports=reports), NOW)
    assert len(events(first, EventReason.WORKER_HUNG)) == 1
    assert first.status is not None
    again = plan(job(maxReplicas=2), first.status, observed(*pods, reports=reports), NOW)
    assert events(again, EventReason.WORKER_HUNG) == []
    assert len(written(again)["hungWorkers"]) == 1


def test_a_running_agents_polled_report_is_not_listed() -> None:
    reports = {wn(1): dataclasses.replace(final(1, teardown()), state=AgentState.RUNNING)}
    listed, fresh = hung.record([worker(0), worker(1)], reports, None, NOW)
    assert listed is None and fresh == []


def test_the_list_keeps_the_newest_entries() -> None:
    known = tuple(HungWorker(pod=f"p{i}", rank=i, round=1, kind="Teardown") for i in range(8))
    pod = worker(1, "Succeeded", exit_code=0)
    listed, fresh = hung.record([pod], {wn(1): final(1, teardown())}, known, NOW)
    assert listed is not None and len(listed) == hung.KEPT
    assert listed[-1].pod == wn(1) and listed[0].pod == "p1" and len(fresh) == 1


TORN = HungWorker(pod="a", rank=0, kind="Teardown", round=3)
STUCK = HungWorker(pod="b", rank=2, kind="Completion", round=3, seconds=301)


@pytest.mark.parametrize(
    ("known", "reason", "named"),
    [
        (None, Reason.FINAL_ROUND_INCOMPLETE, ""),
        ((TORN,), Reason.FINAL_ROUND_INCOMPLETE, ""),
        ((TORN, STUCK), Reason.COMPLETION_HANG, "pod b: rank 2"),
    ],
)
def test_completion_reason(
    known: tuple[HungWorker, ...] | None, reason: Reason, named: str
) -> None:
    got, why = hung.completion_reason(known, None)
    assert got == reason
    assert named in why and (why == "") == (named == "")


def test_status_round_trip_keeps_hung_workers() -> None:
    entry = HungWorker(pod="p", rank=1, kind="Teardown", seconds=2.5, round=4, stack=STACK)
    status = JobStatus(hung_workers=(entry,))
    assert JobStatus.parse(status.to_manifest()) == status
