"""Hangs the agents declared (issue 28): lastFailure, the Event, once per round; the spec.

Driven through ``planner.plan`` with the live report the agent holding node rank 0
serves, plus the pure ``stalls`` rule and ``JobSpec.parse`` in tables.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.operator.factories import (
    NAME,
    NOW,
    ago,
    job,
    job_obj,
    observed,
    parsed,
    worker,
    written,
)
from torchflex_contract import env, labels
from torchflex_contract.progress import AgentReport, AgentState, RankStall, StallReport
from torchflex_operator.model.errors import InvalidSpecError
from torchflex_operator.model.spec import JobSpec
from torchflex_operator.model.vocabulary import EventReason, Reason
from torchflex_operator.planning import plan
from torchflex_operator.planning.rules import stalls
from torchflex_operator.render.builders import contract_env

RUNNING: dict[str, Any] = {"phase": "Running", "startTime": ago(10), "desiredReplicas": 3}


def wn(i: int) -> str:
    return labels.worker_pod_name(NAME, i)


def stall_report(round_no: int = 4, rank: int = 1) -> StallReport:
    ranks = (
        RankStall(rank=rank, pod=wn(rank), steps=39, idle=20.5, stack='File "t.py" in stuck'),
        RankStall(rank=0, pod=wn(0), steps=39, idle=12.0, waiting=True, stack="backward"),
        RankStall(rank=2, pod=wn(2), steps=39, idle=12.1, waiting=True, stack="backward"),
    )
    return StallReport(round=round_no, rank=rank, pod=wn(rank), timeout=20.0, ranks=ranks)


def live(stall: StallReport | None) -> AgentReport:
    return AgentReport(AgentState.RUNNING, round=5, world_size=3, nodes=3, node_rank=0, stall=stall)


def test_a_declared_hang_is_the_last_failure_with_every_ranks_stack_and_an_event() -> None:
    pods = [worker(i) for i in range(3)]
    reports = {wn(0): live(stall_report())}
    result = plan(job(maxReplicas=3), parsed(RUNNING), observed(*pods, reports=reports), NOW)
    status = written(result)
    failure = status["lastFailure"]
    assert failure["reason"] == Reason.HANG and failure["pod"] == wn(1) and failure["rank"] == 1
    assert failure["round"] == 4 and failure["counted"] is False
    assert [s["rank"] for s in failure["stacks"]] == [1, 0, 2]
    assert failure["stacks"][0]["stack"] == 'File "t.py" in stuck'
    assert failure["stacks"][1]["waiting"] is True and failure["stacks"][0]["idleSeconds"] == 20.5
    assert "rank 1" in failure["message"] and "20 s" in failure["message"]
    assert status["lastHangRound"] == 4
    [event] = [e for e in result.events if e.reason == EventReason.HANG_DETECTED]
    assert wn(1) in event.message and "rank 1" in event.message
    # Nothing else changes: no pod is deleted or counted.
    assert not result.delete_pods and status.get("failures") in (None, 0)


def test_each_hang_is_recorded_once_and_a_newer_one_again() -> None:
    pods = [worker(i) for i in range(3)]
    seen = observed(*pods, reports={wn(0): live(stall_report())})
    first = plan(job(), parsed(RUNNING), seen, NOW)
    assert first.status is not None
    again = plan(job(), first.status, seen, NOW)
    assert [e for e in again.events if e.reason == EventReason.HANG_DETECTED] == []
    newer = {wn(2): live(stall_report(round_no=6, rank=2)), wn(0): live(stall_report())}
    third = plan(job(), first.status, observed(*pods, reports=newer), NOW)
    assert written(third)["lastFailure"]["rank"] == 2 and written(third)["lastHangRound"] == 6


@pytest.mark.parametrize(
    ("known", "rounds", "expected"),
    [(None, [], None), (None, [3, 5], 5), (5, [3, 5], None), (4, [3, 5, None], 5)],
)
def test_fresh(known: int | None, rounds: list[int | None], expected: int | None) -> None:
    reports = {
        f"p{i}": live(None if r is None else stall_report(round_no=r)) for i, r in enumerate(rounds)
    }
    got = stalls.fresh(reports, known)
    assert (got.round if got is not None else None) == expected


@pytest.mark.parametrize("value", [-1, 1, 9, 86_401])
def test_spec_refuses_a_bad_hang_timeout(value: int) -> None:
    with pytest.raises(InvalidSpecError, match=r"spec\.hangTimeoutSeconds"):
        JobSpec.parse(job_obj(hangTimeoutSeconds=value))


@pytest.mark.parametrize(("value", "rendered"), [(None, None), (0, "0"), (10, "10"), (300, "300")])
def test_the_hang_timeout_reaches_the_agent_only_when_set(
    value: int | None, rendered: str | None
) -> None:
    spec = job() if value is None else job(hangTimeoutSeconds=value)
    assert spec.hang_timeout_s == value
    got = {e["name"]: e.get("value") for e in contract_env(spec, 0, {"name": "trainer"})}
    assert got.get(env.HANG_TIMEOUT) == rendered
