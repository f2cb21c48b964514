"""Table tests of the agent loop's decisions (``restart_policy``)."""

from __future__ import annotations

import pytest

from torchflex_agent.restart_policy import (
    Action,
    FailureVerdict,
    Observation,
    budget_exhausted,
    decide,
    judge_failure,
)
from torchflex_agent.workers import GroupState
from torchflex_contract.progress import RestartReason

R = RestartReason


@pytest.mark.parametrize(
    ("group", "stale", "terminating", "action"),
    [
        (GroupState.RUNNING, None, False, Action.CONTINUE),
        (GroupState.SUCCEEDED, None, False, Action.SUCCEED),
        (GroupState.FAILED, None, False, Action.INVESTIGATE_FAILURE),
        # a peer left: whatever our workers did is a consequence, not counted
        (GroupState.SUCCEEDED, R.MEMBER_LEFT, False, Action.REFORM),
        (GroupState.FAILED, R.MEMBER_LOST, False, Action.REFORM),
        (GroupState.RUNNING, R.MEMBER_JOINED, False, Action.REFORM),
        (GroupState.RUNNING, R.STORE_LOST, False, Action.REFORM),
        (GroupState.RUNNING, R.WORKER_FAILED, False, Action.REFORM),
        # SIGTERM wins over everything
        (GroupState.FAILED, R.MEMBER_LOST, True, Action.LEAVE),
        (GroupState.RUNNING, None, True, Action.LEAVE),
        (GroupState.SUCCEEDED, None, True, Action.LEAVE),
    ],
)
def test_decide(
    group: GroupState, stale: RestartReason | None, terminating: bool, action: Action
) -> None:
    assert decide(Observation(group, stale, terminating)) is action


@pytest.mark.parametrize(
    ("stale", "verdict"),
    [
        (None, FailureVerdict.COUNT),
        (R.WORKER_FAILED, FailureVerdict.COUNTED_ELSEWHERE),
        (R.MEMBER_LOST, FailureVerdict.COLLATERAL),
        (R.MEMBER_LEFT, FailureVerdict.COLLATERAL),
        (R.MEMBER_JOINED, FailureVerdict.COLLATERAL),
        (R.STORE_LOST, FailureVerdict.COLLATERAL),
    ],
)
def test_judge_failure(stale: RestartReason | None, verdict: FailureVerdict) -> None:
    assert judge_failure(stale) is verdict


@pytest.mark.parametrize(
    ("after", "max_restarts", "exhausted"),
    [(1, 0, True), (1, 1, False), (3, 3, False), (4, 3, True)],
)
def test_budget(after: int, max_restarts: int, exhausted: bool) -> None:
    assert budget_exhausted(after, max_restarts) is exhausted
