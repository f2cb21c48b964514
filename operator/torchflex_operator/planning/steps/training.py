"""Planner steps on what the agents say about training itself.

Where it sits: called by ``planner.plan`` on its pass state (``_Pass``),
pure like the rest of the planner. The phase and ``MinAvailable`` count
pods; these steps read the agents' reports (``Observed.reports``) to say
whether the group actually trains:

* ``training``: condition ``Training``: True once the members of the newest
  rendezvous round all run their workers (its ``lastTransitionTime`` says
  since when), else False with what the agents do instead;
* ``idle``: a finished or suspended job runs nothing: ``Training`` is False
  and a True ``MinAvailable`` / ``AtDesiredSize`` turns False (a False one
  keeps the reason it had, such as the ``BelowMinReplicas`` that timed the
  job out); a succeeded job also carries batch/v1's ``Complete``;
* ``progress``: ``status.progress`` (step, steps per second, checkpoint
  step) and ``status.rank0Pod`` from the reports;
* ``bound_progress``: a pass whose only change is progress writes it at most
  every ``Settings.progress_write_s``; any other change writes it at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from torchflex_contract.progress import AgentReport, AgentState
from torchflex_operator.model.observed import PodView
from torchflex_operator.model.status import ConditionStatus, TrainingProgress
from torchflex_operator.model.vocabulary import ConditionType, Reason

if TYPE_CHECKING:
    from torchflex_operator.planning.pipeline import _Pass

# What an agent of the newest round does when it is not running workers.
_NOT_TRAINING: Mapping[AgentState, tuple[Reason, str]] = {
    AgentState.RESTARTING: (Reason.WORKERS_RESTARTING, "restarting its workers"),
    AgentState.FAILED: (Reason.WORKERS_RESTARTING, "failed"),
    AgentState.SUCCEEDED: (Reason.COMPLETING, "finished"),
    AgentState.RENDEZVOUS: (Reason.RENDEZVOUSING, "re-forming the group"),
    AgentState.INIT: (Reason.RENDEZVOUSING, "re-forming the group"),
    AgentState.LEAVING: (Reason.RENDEZVOUSING, "leaving the group"),
}


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


def training(p: _Pass) -> None:
    """``Training`` of a job that is neither finished nor suspended."""
    state = group_state(p.workers, p.obs.reports)
    p.set_condition(
        ConditionType.TRAINING, status=state.training, reason=state.reason, message=state.message
    )


def idle(p: _Pass, reason: Reason, message: str) -> None:
    """Conditions of a job that runs nothing on purpose (finished or suspended)."""
    p.set_condition(ConditionType.TRAINING, status=False, reason=reason, message=message)
    for ctype in (ConditionType.MIN_AVAILABLE, ConditionType.AT_DESIRED_SIZE):
        cond = p.condition(ctype)
        if cond is not None and cond.status is ConditionStatus.TRUE:
            p.set_condition(ctype, status=False, reason=reason, message=message)
    succeeded = p.condition(ConditionType.SUCCEEDED)
    if succeeded is not None and p.condition(ConditionType.COMPLETE) is None:
        # A job an older operator finished: the same fact under batch/v1's name.
        done = replace(succeeded, type=ConditionType.COMPLETE.value)
        p.s = replace(p.s, conditions=(*(p.s.conditions or ()), done))


def _holds_rank0(report: AgentReport) -> bool:
    # Agents from before holds_rank0 say node rank 0 (its workers start at rank 0).
    return report.holds_rank0 or report.node_rank == 0


def progress(p: _Pass) -> None:
    """``status.progress`` and ``status.rank0Pod`` from the agents' reports.

    Reports of live and finished workers count (a finished job keeps its last
    step). The newest round's report wins, then the highest step; nothing
    reported keeps what status says (the pods that said it may be gone).
    """
    names = {w.name for w in p.workers if not w.terminating or w.finished}
    reports = [(n, r) for n, r in sorted(p.obs.reports.items()) if n in names]
    holders = [(r.round, n) for n, r in reports if r.round >= 0 and _holds_rank0(r)]
    if holders:
        p.s = replace(p.s, rank0_pod=max(holders)[1])
    reported = [(n, r.progress) for n, r in reports if r.progress is not None]
    if not reported:
        return
    pod, got = max(reported, key=lambda item: (item[1].round, item[1].step, item[0]))
    fresh = TrainingProgress(
        step=got.step if got.step >= 0 else None,
        steps_per_second=round(got.steps_per_second, 3) if got.steps_per_second > 0 else None,
        checkpoint_step=got.checkpoint_step if got.checkpoint_step >= 0 else None,
        round=got.round if got.round >= 0 else None,
        pod=pod,
    )
    shown = p.s.progress
    if shown is not None and replace(shown, last_update_time=None) == fresh:
        return
    p.s = replace(p.s, progress=replace(fresh, last_update_time=p.stamp))


def bound_progress(p: _Pass) -> None:
    """Hold back a progress-only change until ``progress_write_s`` after the last.

    Run last in a pass: when anything else changed, status is written anyway
    and carries the fresh progress with it.
    """
    shown, fresh = p.prior.progress, p.s.progress
    if shown is None or fresh == shown or replace(p.s, progress=shown) != p.prior:
        return
    age = p.since(shown.last_update_time)
    left = p.settings.progress_write_s - (age if age is not None else p.settings.progress_write_s)
    if left <= 0:
        return
    p.s = replace(p.s, progress=shown)
    p.plan.wake_in(left)
