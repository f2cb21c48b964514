"""Planner steps on what the agents say about training itself.

Where it sits: pure steps ``(Ctx, Draft) -> Draft`` of the planner's
pipeline. The phase and ``MinAvailable`` count pods; these steps read the
agents' reports (``Observed.reports``) to say whether the group actually
trains:

* ``training``: condition ``Training``: True once the members of the newest
  rendezvous round all run their workers (its ``lastTransitionTime`` says
  since when), else False with what the agents do instead (``rules.activity``);
* ``progress``: ``status.progress`` (step, steps per second, checkpoint
  step) and ``status.rank0Pod`` from the reports;
* ``bound_progress``: a pass whose only change is progress writes it at most
  every ``Settings.progress_write_s``; any other change writes it at once.
"""

from __future__ import annotations

from dataclasses import replace

from torchflex_contract.progress import AgentReport
from torchflex_operator.model.status import TrainingProgress
from torchflex_operator.model.vocabulary import ConditionType
from torchflex_operator.planning.context import Ctx, Draft, completion_group, group_members
from torchflex_operator.planning.rules.activity import group_state


def training(ctx: Ctx, d: Draft) -> Draft:
    """``Training`` of a job that is neither finished nor suspended."""
    state = group_state(group_members(ctx, d), ctx.obs.reports)
    return d.set_condition(
        ctx,
        ConditionType.TRAINING,
        status=state.training,
        reason=state.reason,
        message=state.message,
    )


def _holds_rank0(report: AgentReport) -> bool:
    # Agents from before holds_rank0 say node rank 0 (its workers start at rank 0).
    return report.holds_rank0 or report.node_rank == 0


def progress(ctx: Ctx, d: Draft) -> Draft:
    """``status.progress`` and ``status.rank0Pod`` from the agents' reports (of a
    multi-role job: its completion role's).

    Reports of live and finished workers count (a finished job keeps its last
    step). The newest round's report wins, then the highest step; nothing
    reported keeps what status says (the pods that said it may be gone).
    """
    names = {w.name for w in d.members if not w.terminating or w.finished}
    names &= completion_group(ctx, d)  # a multi-role job's: its completion role's
    reports = [(n, r) for n, r in sorted(ctx.obs.reports.items()) if n in names]
    holders = [(r.round, n) for n, r in reports if r.round >= 0 and _holds_rank0(r)]
    if holders:
        d = d.with_status(rank0_pod=max(holders)[1])
    reported = [(n, r.progress) for n, r in reports if r.progress is not None]
    if not reported:
        return d
    pod, got = max(reported, key=lambda item: (item[1].round, item[1].step, item[0]))
    fresh = TrainingProgress(
        step=got.step if got.step >= 0 else None,
        steps_per_second=round(got.steps_per_second, 3) if got.steps_per_second > 0 else None,
        checkpoint_step=got.checkpoint_step if got.checkpoint_step >= 0 else None,
        round=got.round if got.round >= 0 else None,
        pod=pod,
    )
    shown = d.status.progress
    if shown is not None and replace(shown, last_update_time=None) == fresh:
        return d
    return d.with_status(progress=replace(fresh, last_update_time=ctx.stamp))


def bound_progress(ctx: Ctx, d: Draft) -> Draft:
    """Hold back a progress-only change until ``progress_write_s`` after the last.

    Run last in a pass: when anything else changed, status is written anyway
    and carries the fresh progress with it.
    """
    shown, fresh = ctx.prior.progress, d.status.progress
    if shown is None or fresh == shown or replace(d.status, progress=shown) != ctx.prior:
        return d
    age = ctx.since(shown.last_update_time)
    every = ctx.settings.progress_write_s
    left = every - (age if age is not None else every)
    if left <= 0:
        return d
    return d.with_status(progress=shown).wake_in(left)
