"""What the worker group is doing, from its agents' reports: training, or why not.

Where it sits: a pure rule of the planner; ``steps.training`` turns it into the
``Training`` condition.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from torchflex_contract.progress import AgentReport, AgentState
from torchflex_operator.model.observed import PodView
from torchflex_operator.model.vocabulary import Reason

# What an agent of the newest round does when it is not running workers.
_NOT_TRAINING: Mapping[AgentState, tuple[Reason, str]] = MappingProxyType(
    {
        AgentState.RESTARTING: (Reason.WORKERS_RESTARTING, "restarting its workers"),
        AgentState.FAILED: (Reason.WORKERS_RESTARTING, "failed"),
        AgentState.SUCCEEDED: (Reason.COMPLETING, "finished"),
        AgentState.RENDEZVOUS: (Reason.RENDEZVOUSING, "re-forming the group"),
        AgentState.INIT: (Reason.RENDEZVOUSING, "re-forming the group"),
        AgentState.LEAVING: (Reason.RENDEZVOUSING, "leaving the group"),
    }
)


@dataclasses.dataclass(frozen=True)
class GroupState:
    training: bool
    reason: Reason
    message: str


def group_state(workers: Sequence[PodView], reports: Mapping[str, AgentReport]) -> GroupState:
    """Whether the worker group trains, from the reports of running worker pods.

    The newest round any running pod's agent reports is the group's; it
    trains while every agent reporting that round runs its workers. Agents
    of older rounds (a pod waiting to join, reporting round -1) do not stop
    it: the group trains on until it re-forms to take them in.
    """
    running = [w for w in workers if w.running]
    if not running:
        return GroupState(False, Reason.NO_WORKERS_RUNNING, "no worker pod is running")
    members = [r for w in running if (r := reports.get(w.name)) is not None and r.round >= 0]
    if not members:
        return GroupState(
            False,
            Reason.AGENTS_STARTING,
            f"{len(running)} worker pod(s) running; no agent has completed a rendezvous yet",
        )
    rnd = max(r.round for r in members)
    current = [r for r in members if r.round == rnd]
    others = [r for r in current if r.state is not AgentState.RUNNING]
    if not others:
        world = max(r.world_size for r in current)
        return GroupState(
            True,
            Reason.WORKERS_TRAINING,
            f"world size {world} training in rendezvous round {rnd} "
            f"({len(current)} agent(s) reporting)",
        )
    reason, doing = _NOT_TRAINING[others[0].state]
    return GroupState(False, reason, f"rendezvous round {rnd} is over: an agent is {doing}")
