"""Steps on the group's size: enough members running, scaling toward ``desiredReplicas``,
and ``AtDesiredSize`` saying why the job is not there.

Where it sits: pure steps ``(Ctx, Draft) -> Draft`` of the planner's pipeline. ``pace``
computes the pass's creation budget once (``rules.pacing``) and hands it on in
``Draft.budget`` to ``scale``, ``steps.spares.keep`` and ``desired_size``; a refused
create (``Draft.held``) creates nothing.
"""

from __future__ import annotations

from dataclasses import replace

from torchflex_contract import labels
from torchflex_operator.model.timestamps import format_time
from torchflex_operator.model.vocabulary import ConditionType, EventReason, EventType, Phase, Reason
from torchflex_operator.planning.context import Ctx, Draft, finish
from torchflex_operator.planning.rules import pacing, rollout
from torchflex_operator.render import builders, podgroup


def availability(ctx: Ctx, d: Draft) -> Draft:
    """``MinAvailable`` and the phase; fail the job below ``minReplicas`` for too long."""
    job = ctx.job
    running = sum(1 for w in d.members if w.running)
    if running >= job.min_replicas:
        d = d.with_status(below_min_since=None, phase=Phase.RUNNING)
        return d.set_condition(
            ctx,
            ConditionType.MIN_AVAILABLE,
            status=True,
            reason=Reason.MIN_REPLICAS_RUNNING,
            message=f"{running} of minimum {job.min_replicas} workers running",
        )
    began = d.status.below_min_since or ctx.stamp
    below = ctx.since(began) or 0.0
    was_running = ctx.prior_phase in (Phase.RUNNING, Phase.RESTARTING)
    phase = Phase.RESTARTING if was_running else Phase.PENDING
    d = d.with_status(below_min_since=began, phase=phase)
    message = f"{running} of minimum {job.min_replicas} workers running"
    d = d.set_condition(
        ctx,
        ConditionType.MIN_AVAILABLE,
        status=False,
        reason=Reason.BELOW_MIN_REPLICAS,
        message=message,
    )
    left = job.min_available_timeout_s - below
    if left <= 0:
        return finish(
            ctx,
            d,
            Phase.FAILED,
            Reason.MIN_AVAILABLE_TIMEOUT,
            f"{message} for over minAvailableTimeoutSeconds={job.min_available_timeout_s}",
        )
    return d.wake_in(left)


def pace(ctx: Ctx, d: Draft) -> Draft:
    """The pass's creation budget (``rules.pacing``), computed once for whichever group
    grows: the members while some are missing (``scale``), else members and warm spares
    together (``steps.spares.keep``: spares are created only once no member is missing)."""
    job = ctx.job
    missing = sum(1 for w in d.members if w.active) < job.desired
    pool = d.members if missing else (*d.members, *d.spares)
    at_once = podgroup.pods_at_once(job, ctx.settings)
    return replace(d, budget=pacing.budget(pool, ctx.settings, at_once))


def scale(ctx: Ctx, d: Draft) -> Draft:
    """Scale toward ``desiredReplicas`` within ``Draft.budget`` (a refused create waits)."""
    job = ctx.job
    desired = job.desired
    prior_desired = d.status.desired_replicas
    if prior_desired is not None and prior_desired != desired:
        up = desired > prior_desired
        d = d.event(
            EventType.NORMAL,
            EventReason.SCALED_UP if up else EventReason.SCALED_DOWN,
            f"desired replicas {prior_desired} -> {desired}",
        )
    d = d.with_status(desired_replicas=desired)
    active = [w for w in d.members if w.active]
    if len(active) > desired:
        # Members in the warm spares' range first (spares live there), then
        # pending pods (they hold no training state), then out-of-date ones
        # (they would be rolled anyway), then highest indices.
        current = builders.template_hash(job)
        victims = sorted(
            active,
            key=lambda w: (
                not (job.warm_spares and (w.index or 0) >= desired),
                w.running,
                not rollout.outdated(w, current),
                -(w.index or 0),
            ),
        )
        for pod in victims[: len(active) - desired]:
            d = d.delete(pod)
        return d
    missing = desired - len(active)
    if missing <= 0 or d.held:
        return d
    until = d.status.backoff_until
    if until is not None and until > ctx.now:
        return d.wake_in((until - ctx.now).total_seconds())
    # At most maxReplicas worker objects, one pod per index, paced (pacing.py).
    budget = d.budget
    assert budget is not None, "pace runs before scale"
    occupied = {w.index for w in (*d.members, *d.spares)}
    room = job.max_replicas - len(d.members) - len(d.spares)
    take = min(missing, room, budget.allowed)
    free = [i for i in range(job.max_replicas) if i not in occupied][:take]
    d = d.create(
        *(
            builders.worker_pod(
                job, index, ctx.settings, role=ctx.role, avoid=d.status.avoided_nodes or ()
            )
            for index in free
        )
    )
    if free:
        names = ", ".join(labels.worker_pod_name(job.name, i, ctx.role) for i in free)
        d = d.event(EventType.NORMAL, EventReason.CREATED_POD, f"created {names}")
    return d


def desired_size(ctx: Ctx, d: Draft) -> Draft:
    """``AtDesiredSize``: True when ``desiredReplicas`` workers run, else why not."""
    job, settings, budget = ctx.job, ctx.settings, d.budget
    desired = job.desired if d.status.desired_replicas is None else d.status.desired_replicas
    running = sum(1 for w in d.members if w.running)
    active = sum(1 for w in d.members if w.active)
    have = f"{running} of {desired} desired workers running"
    until = d.status.backoff_until
    if running >= desired:
        status, reason, message = True, Reason.DESIRED_SIZE_RUNNING, have
    elif d.held:
        status, reason = False, Reason.CREATE_REFUSED
        message = f"{have}; pod creation refused (see ChildrenAccepted)"
    elif until is not None and until > ctx.now and active < desired:
        status, reason = False, Reason.BACKING_OFF
        message = f"{have}; replacements wait until {format_time(until)}"
    elif budget is not None and budget.capped and active < desired:
        status, reason = False, Reason.PENDING_CAP_REACHED
        message = (
            f"{have}; {budget.unscheduled} pod(s) wait for a node (at most "
            f"{settings.max_unscheduled}); {desired - active} more are created as they schedule"
        )
        shown = d.condition(ConditionType.AT_DESIRED_SIZE)
        if d.turns(ConditionType.AT_DESIRED_SIZE, False) or (
            shown is None or shown.reason != reason.value
        ):
            d = d.event(EventType.WARNING, EventReason.PENDING_CAP_REACHED, message)
    elif active < desired:
        status, reason = False, Reason.SCALING_UP
        message = f"{have}; {active} created, in growing batches as pods get a node"
    else:
        status, reason = False, Reason.STARTING
        message = f"{have}; {active - running} starting"
    return d.set_condition(
        ctx, ConditionType.AT_DESIRED_SIZE, status=status, reason=reason, message=message
    )
