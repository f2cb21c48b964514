"""Table tests of the agent loop's decisions (``restart_policy``)."""

from __future__ import annotations

import pytest

from torchflex_agent.loop.logic.policy import (
    Action,
    FailureVerdict,
    Observation,
    budget_exhausted,
    closed_job_exit,
    decide,
    judge_failure,
    root_cause,
)
from torchflex_agent.workers.logic import GroupState
from torchflex_contract.exit_codes import ExitCode
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


GLOO_RESET = (
    "rank 1 failed (exit code 1): RuntimeError: [gloo/transport/tcp/pair.cc:553] "
    "Connection closed by peer [10.0.0.4]:26780"
)
USER_RAISE = "rank 0 failed (exit code 1): ValueError: loss went NaN"


@pytest.mark.parametrize(
    ("own", "reported", "expect"),
    [
        pytest.param(USER_RAISE, [], USER_RAISE, id="alone"),
        pytest.param(GLOO_RESET, [USER_RAISE], USER_RAISE, id="counted-by-the-collateral-rank"),
        pytest.param(USER_RAISE, [GLOO_RESET], USER_RAISE, id="counted-by-the-culprit"),
        pytest.param(GLOO_RESET, [GLOO_RESET], GLOO_RESET, id="only-symptoms"),
        pytest.param(GLOO_RESET, ["", "rank 2 failed (killed by SIGSEGV)"],
                     "rank 2 failed (killed by SIGSEGV)", id="crash-elsewhere"),
    ],
)  # fmt: skip
def test_root_cause_prefers_the_real_error_over_peer_loss(
    own: str, reported: list[str], expect: str
) -> None:
    assert root_cause(own, reported) == expect


@pytest.mark.parametrize(
    ("workers_succeeded", "code"),
    [
        # Rank 0 finished saving after its peers closed the job (a late joiner had
        # marked the round stale): its part is done, its pod says so.
        (True, ExitCode.SUCCESS),
        # A member re-forming for any other reason finds the job over: not a failure.
        (False, ExitCode.RENDEZVOUS_CLOSED),
    ],
)
def test_closed_job_exit(workers_succeeded: bool, code: ExitCode) -> None:
    assert closed_job_exit(workers_succeeded) is code
