"""The pure reconcile: ``plan(job, status, observed, now) -> Plan``, its steps in order.

Where it sits: the heart of the operator. ``runtime.reconcile`` observes, parses the
job (``JobSpec``) and its status (``JobStatus``), calls ``plan`` and applies the
result; nothing here touches the API or the clock, so every decision is
table-tested (tests/unit/operator). One pass looks at the whole observed state of
one job (level-triggered) and decides: pods and Services to create, pods to delete
(gracefully, or forced off a lost node), the complete new status (typed fields,
datetimes, no strings until the runtime writes it), Events, and when to look again.

The order of the steps is the data below, one tuple per branch; ``fold`` runs one.
Each step is a pure ``(Ctx, Draft) -> Draft`` (``planning.context``) of one module
of ``planning.steps``: a step reads the frozen inputs and what earlier steps decided,
and returns what it adds. A live job runs ``OPENING``, then ``COMPLETING`` while some
member exited 0, else ``LIVE`` until a step finishes the job; then ``ENDED`` (the job
finished in this pass) or ``GOING_ON``; every pass closes with ``CLOSING``. A
multi-role job (``spec.roles``) runs ``OPENING`` and ``COMPLETING``/``LIVE`` once per
role, over the role's view and pods (``_run_roles``), and its phase and conditions are
merged from the roles' (``rules.roles``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import replace

from torchflex_operator.model.observed import Observed
from torchflex_operator.model.plan import Plan
from torchflex_operator.model.settings import Settings
from torchflex_operator.model.spec import JobSpec
from torchflex_operator.model.status import JobStatus
from torchflex_operator.planning.context import Ctx, Draft
from torchflex_operator.planning.rules.roles import (
    MERGED,
    RoleOutcome,
    below_min_since,
    job_condition,
    job_phase,
)
from torchflex_operator.planning.steps import (
    children,
    completing,
    counts,
    failed,
    fence,
    lifecycle,
    outcome,
    rolling,
    scaling,
    spares,
    store,
    stragglers,
    training,
)

Step = Callable[[Ctx, Draft], Draft]

FINISHED: tuple[Step, ...] = (lifecycle.cleanup, spares.retire)
"""A job that finished in an earlier pass: clean up, then TTL."""
SUSPENDED: tuple[Step, ...] = (lifecycle.suspend,)
HELD: tuple[Step, ...] = (lifecycle.hold,)
"""Kueue holds the queued job (waiting for admission, or evicted)."""
OPENING: tuple[Step, ...] = (
    lifecycle.resume,
    failed.account,
    failed.hung,
    failed.stall,
    failed.force_delete_stuck,
    outcome.judge,
)
"""Every live pass: account what ended, then whether the job ends now."""
COMPLETING: tuple[Step, ...] = (
    completing.complete,
    spares.retire,
    training.training,
)
"""Some member exited 0: wait for the rest of the final round, start nothing."""
LIVE: tuple[Step, ...] = (
    spares.promote,
    failed.replace_failed,
    fence.fence,
    stragglers.stragglers,
    children.refusals,
    scaling.availability,
    training.training,
    store.liveness,
    store.rendezvous_host,
    children.services,
    children.network_policy,
    scaling.pace,
    scaling.scale,
    rolling.roll,
    spares.keep,
    scaling.desired_size,
)
"""A job that trains: stopped at the first step after which the job has finished."""
ENDED: tuple[Step, ...] = (lifecycle.cleanup, spares.retire)
"""The job finished in this very pass."""
GOING_ON: tuple[Step, ...] = (lifecycle.resync,)
CLOSING: tuple[Step, ...] = (
    lifecycle.queue_poll,
    lifecycle.idle,
    counts.generations,
    counts.counts,
    counts.roles,
    training.progress,
    counts.settle_events,
    training.bound_progress,
)
"""Every pass that writes a status, whatever its branch."""


def fold(ctx: Ctx, d: Draft, steps: Sequence[Step], *, while_live: bool = False) -> Draft:
    """Run ``steps`` in order; with ``while_live``, stop once the job has finished."""
    for step in steps:
        if while_live and d.finished:
            break
        d = step(ctx, d)
    return d


def _live(ctx: Ctx, d: Draft) -> Draft:
    """One worker group's live pass: ``OPENING``, then ``COMPLETING`` or ``LIVE``."""
    d = fold(ctx, d, OPENING)
    if not d.finished:
        d = fold(ctx, d, COMPLETING if d.verdict is not None else LIVE, while_live=True)
    return d


def _as_held(ctx: Ctx, status: JobStatus) -> JobStatus:
    """``status`` with the fields the roles of a job merge (phase, the below-minimum
    timer, ``rules.roles.MERGED``'s conditions) as the API holds them."""
    held = {c.type: c for c in ctx.prior.conditions or () if any(c.is_type(t) for t in MERGED)}
    merged = {t.value for t in MERGED}
    # In place, so that the list keeps its order from pass to pass (no needless write).
    conds = [held.get(c.type) if c.type in merged else c for c in status.conditions or ()]
    seen = {c.type for c in status.conditions or ()}
    conds += [c for t, c in held.items() if t not in seen]
    return replace(
        status,
        phase=ctx.prior.phase,
        below_min_since=ctx.prior.below_min_since,
        conditions=tuple(c for c in conds if c is not None),
    )


def _role_draft(ctx: Ctx, d: Draft) -> Draft:
    """``d`` made ready for role ``ctx.role``'s pass: that role's pods, no hand-offs of
    the role before, and the merged phase, timer and conditions as the API holds them
    (each role decides its own from there; ``rules.roles`` merges them after)."""
    start = Draft.start(ctx)
    # The role's own desired count as the last pass left it (``status.roles``): its
    # scale events compare with that, not with the job's sum.
    shown = next((r.desired for r in ctx.prior.roles or () if r.name == ctx.role), None)
    return replace(
        d,
        status=replace(_as_held(ctx, d.status), desired_replicas=shown),
        members=start.members,
        spares=start.spares,
        failed=(),
        fatal="",
        verdict=None,
        held=False,
        budget=None,
    )


def _merge(ctx: Ctx, d: Draft, outcomes: Sequence[RoleOutcome]) -> Draft:
    """The job's phase, timer and conditions from its roles' (``rules.roles``)."""
    status = replace(
        _as_held(ctx, d.status),
        phase=job_phase(outcomes),
        below_min_since=below_min_since(outcomes),
    )
    d = replace(d, status=replace(status, desired_replicas=ctx.job.desired))
    for ctype in MERGED:
        said = job_condition(ctype, outcomes)
        if said is not None:
            d = d.set_condition(
                ctx, ctype, status=said.status, reason=said.reason, message=said.message
            )
    return d


def _run_roles(ctx: Ctx, d: Draft) -> Draft:
    """A multi-role job: each role planned in turn as a job of one group (its
    ``role_view``, its pods), the completion role first, each from the status the one
    before left (counters, failures and Events add up; the store, its Service and the
    NetworkPolicy are the job's, created once). A role that finishes the job ends the
    pass (nothing more is created; ``ENDED`` stops the other roles' pods); else the
    roles' phases and conditions are merged (``rules.roles``)."""
    job = ctx.job
    first = job.completion_role_name
    views = sorted(job.role_views(), key=lambda v: v.role != first)
    outcomes: list[RoleOutcome] = []
    for view in views:
        rctx = replace(ctx, job=view, role=view.role, completes=job.joint or view.role == first)
        d = _live(rctx, _role_draft(rctx, d))
        if d.finished:
            break
        s = d.status
        outcomes.append(RoleOutcome(view.role, s.phase, s.below_min_since, s.conditions or ()))
    pods = [w for v in views for w in ctx.obs.workers(v.role)]
    d = replace(
        d,
        members=tuple(w for w in pods if not w.standby),
        spares=tuple(w for w in pods if w.standby),
    )
    if d.finished:
        d = replace(d, create_pods=(), create_services=(), create_network_policies=())
        return fold(ctx, d.with_status(desired_replicas=job.desired), ENDED)
    return fold(ctx, _merge(ctx, d, outcomes), GOING_ON)


def _run(ctx: Ctx, d: Draft) -> Draft:
    prior = ctx.prior_phase
    if prior is not None and prior.finished:
        return fold(ctx, d, FINISHED)
    if ctx.job.suspend:
        return fold(ctx, d, SUSPENDED)
    if ctx.obs.queue is not None and ctx.obs.queue.holds:
        return fold(ctx, d, HELD)
    if ctx.job.multi_role:
        return _run_roles(ctx, d)
    d = _live(ctx, d)
    return fold(ctx, d, ENDED if d.finished else GOING_ON)


def plan(
    job: JobSpec,
    status: JobStatus,
    observed: Observed,
    now: dt.datetime,
    settings: Settings | None = None,
) -> Plan:
    """Decide everything one reconcile pass does for ``job``; pure."""
    ctx = Ctx.of(job, status, observed, now, settings or Settings())
    if ctx.job.deleting:
        return Plan()  # the garbage collector owns teardown; no status to write
    d = _run(ctx, Draft.start(ctx))
    return fold(ctx, d, CLOSING).to_plan()
