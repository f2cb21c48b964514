"""Pure decisions of the agent loop: given what was observed, what to do next.

Where it sits: in ``loop.logic`` (was ``restart_policy``). ``loop.supervise``'s
``RoundSupervisor`` gathers observations (worker group state, the round's stale
mark, SIGTERM, store loss) and acts on the ``Action`` these functions return;
keeping them free of I/O lets the rules be table-tested. The rules: membership
changes never consume the restart budget, worker failures do (once per round,
job-wide), SIGTERM always wins. ``GroupState``, the worker group's state as
observed, comes from the pure ``workers.logic`` (``workers.group`` reports in
it), so this module imports nothing that spawns or signals a process (the
import-linter purity contract over every ``logic`` keeps it so).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import assert_never

from torchflex_agent.workers.logic import GroupState
from torchflex_contract.exit_codes import ExitCode
from torchflex_contract.progress import RestartReason


class Action(enum.Enum):
    CONTINUE = "continue"
    """Keep running; nothing happened."""
    SUCCEED = "succeed"
    """Workers finished: close the job's rendezvous, exit 0."""
    LEAVE = "leave"
    """SIGTERM: mark the round stale (MemberLeft), let workers checkpoint, exit 75."""
    REFORM = "reform"
    """The round ended for a reason that is not ours to count: re-rendezvous."""
    INVESTIGATE_FAILURE = "investigate"
    """A local worker failed and the round still looks healthy: probe peers first."""


@dataclasses.dataclass(frozen=True)
class Observation:
    group: GroupState
    stale: RestartReason | None
    """The round's stale reason if the monitor (or a direct read) saw one."""
    terminating: bool = False


def decide(obs: Observation) -> Action:
    if obs.terminating:
        return Action.LEAVE
    if obs.stale is not None:
        # Whatever the workers did, the round is over: a success or failure
        # that coincides with a peer leaving is a consequence of the leave.
        return Action.REFORM
    if obs.group is GroupState.FAILED:
        return Action.INVESTIGATE_FAILURE
    if obs.group is GroupState.SUCCEEDED:
        return Action.SUCCEED
    if obs.group is GroupState.RUNNING:
        return Action.CONTINUE
    assert_never(obs.group)  # mypy: a new GroupState needs its rule here


def closed_job_exit(workers_succeeded: bool) -> ExitCode:
    """The agent's exit when it finds the job's rendezvous closed as it re-joins.

    A member whose own workers all exited 0 in the round that just ended (rank 0
    saving the final model while its peers finished and a late joiner marked the
    round stale) finished its part: exit 0, like a member that saw the success
    first. Any other member was still needed by nothing: 76, not a failure either.
    """
    return ExitCode.SUCCESS if workers_succeeded else ExitCode.RENDEZVOUS_CLOSED


class FailureVerdict(enum.Enum):
    COLLATERAL = "collateral"
    """A peer left or was lost at the same time: restart, do not count."""
    COUNTED_ELSEWHERE = "counted-elsewhere"
    """Another node already counted this round's failure: restart, do not count again."""
    COUNT = "count"
    """Ours to count: claim the round's failure and increment the job's restarts."""


def judge_failure(stale_after_probe: RestartReason | None) -> FailureVerdict:
    """Classify a local worker failure once the short peer probe is done."""
    if stale_after_probe is None:
        return FailureVerdict.COUNT
    if stale_after_probe is RestartReason.WORKER_FAILED:
        return FailureVerdict.COUNTED_ELSEWHERE
    return FailureVerdict.COLLATERAL


def budget_exhausted(restarts_after_count: int, max_restarts: int) -> bool:
    """``max_restarts`` restarts are allowed; the failure that would need one more ends the job."""
    return restarts_after_count > max_restarts


# What a worker reports when a *peer* died under it mid-collective (gloo,
# NCCL, the c10d store): a symptom, not the job's real error.
PEER_LOSS_SYMPTOMS: tuple[str, ...] = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "DistNetworkError",
    "DistBackendError",
    "Socket Timeout",
    "remote process exited or there was a network error",
    "NCCL communicator was aborted",
)


def looks_collateral(message: str) -> bool:
    return any(symptom in message for symptom in PEER_LOSS_SYMPTOMS)


def root_cause(own: str, reported: list[str]) -> str:
    """The failure to name when the job gives up.

    Every member whose workers failed in the round reports its message (in
    node-rank order); when one rank raised and the others only lost their
    connection to it, the raise is the cause the user must see, whichever
    agent happened to count the failure.
    """
    for message in [own, *reported]:
        if message and not looks_collateral(message):
            return message
    return own
