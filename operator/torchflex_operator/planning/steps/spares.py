"""Warm spares (``spec.warmSpares``): prewarmed worker pods kept beyond ``desired``.

Where it sits: pure steps ``(Ctx, Draft) -> Draft`` of the planner's
pipeline. A spare is a worker pod annotated
``torchflex.io/standby: "true"``: its agent imports torch and starts its
fork server, then waits outside the rendezvous until the annotation (a
downward-API file, ``builders``) reads anything else. The pass sees spares
apart from members (``Draft.spares``): they are never counted as replicas,
ready pods, world size, progress or stalls, and never end the job.

Spares sit at indices ``desired .. desired + wanted - 1``. Scaling up turns
the spare at an index below the new ``desired`` into a member with one
annotation patch (``promote``); the rest (``keep``) creates the missing
spares once every member exists, and deletes spares that failed, are out of
date, or sit beyond the range. A failed spare is replaced under the usual
replacement backoff but never counted against ``backoffLimit``: it ran no
training. A finished, suspended or completing job keeps none (``retire``).
"""

from __future__ import annotations

from dataclasses import replace

from torchflex_contract import labels
from torchflex_operator.model.observed import PodView
from torchflex_operator.model.plan import PodPromote
from torchflex_operator.model.vocabulary import EventReason, EventType, Reason
from torchflex_operator.planning import ledger
from torchflex_operator.planning.context import Ctx, Draft
from torchflex_operator.planning.rules import rollout
from torchflex_operator.planning.rules.failures import classify
from torchflex_operator.render import builders


def _wanted(ctx: Ctx) -> int:
    """Spares the job keeps now: only room to grow (``maxReplicas - desired``) is filled;
    in a Kueue queue, only room within the admitted count (Kueue's quota covers no more)."""
    top = ctx.job.max_replicas
    gate = ctx.obs.queue
    if gate is not None:  # a role of a multi-role job: its own pod set's count
        top = min(top, dict(gate.role_counts).get(ctx.role, gate.count))
    return max(0, min(ctx.job.warm_spares, top - ctx.job.desired))


def promote(ctx: Ctx, d: Draft) -> Draft:
    """Spares at an index below ``desired`` become members (a scale-up reached them)."""
    for spare in d.spares:
        if not spare.active or (spare.index or 0) >= ctx.job.desired:
            continue
        d = replace(d, promote_pods=(*d.promote_pods, PodPromote(spare.name, spare.uid)))
        d = d.event(
            EventType.NORMAL,
            EventReason.SPARE_PROMOTED,
            f"promoted warm spare {spare.name} to a member",
        )
        # A member from here on, in this very pass (counts, scale, availability).
        d = replace(
            d,
            spares=tuple(s for s in d.spares if s is not spare),
            members=tuple(sorted([*d.members, replace(spare, standby=False)], key=_order)),
        )
    return d


def keep(ctx: Ctx, d: Draft) -> Draft:
    """Delete spares that failed, are out of date or out of range; create the missing ones."""
    job, want = ctx.job, _wanted(ctx)
    top = job.desired + want  # spares live at indices desired .. top - 1
    current = builders.template_hash(job)
    failed = [s for s in d.spares if s.phase == "Failed"]
    for spare in d.spares:
        if spare.terminating:
            continue
        if spare.finished or rollout.outdated(spare, current) or (spare.index or 0) >= top:
            d = d.delete(spare)
    d = _back_off(ctx, d, failed)
    live = [s for s in d.spares if s.active and (s.index or 0) < top and s not in failed]
    live = [s for s in live if not rollout.outdated(s, current)]
    missing = want - len(live)
    leaving = d.leaving
    members = sum(1 for w in d.members if w.active and w.name not in leaving)
    until = d.status.backoff_until
    if missing <= 0 or d.held or members < job.desired:
        return d  # members first: a spare never takes a place a member needs
    if until is not None and until > ctx.now:
        return d.wake_in((until - ctx.now).total_seconds())
    created = d.workers_created
    budget = d.budget
    assert budget is not None, "pace runs before keep"
    occupied = {w.index for w in (*d.members, *d.spares)}
    free = [i for i in range(job.desired, top) if i not in occupied]
    take = free[: max(0, min(missing, budget.allowed - created))]
    built = (
        builders.worker_pod(
            job, i, ctx.settings, spare=True, role=ctx.role, avoid=d.status.avoided_nodes or ()
        )
        for i in take
    )
    d = d.create(*built)
    if take:
        names = ", ".join(labels.worker_pod_name(job.name, i, ctx.role) for i in take)
        d = d.event(EventType.NORMAL, EventReason.CREATED_POD, f"created warm spare {names}")
    return d


def retire(ctx: Ctx, d: Draft) -> Draft:
    """A job that trains no more keeps no spare, whatever ``cleanPodPolicy`` says:
    a spare would otherwise wait for a promotion that never comes."""
    for spare in d.spares:
        if not spare.terminating:
            d = d.delete(spare)
    return d


def _back_off(ctx: Ctx, d: Draft, failed: list[PodView]) -> Draft:
    """A newly failed spare starts the usual replacement backoff, uncounted."""
    fresh = ledger.fresh(d, failed)
    if not fresh:
        return d
    hit = False
    for spare in fresh:
        failure = classify(spare, ctx.obs)
        if failure.reason is Reason.POD_DELETED:
            continue  # deleted on purpose (out of range, out of date): no fault
        hit = True
        d = d.event(
            EventType.WARNING,
            EventReason.REPLACED_POD,
            f"warm spare {spare.name} ended ({failure.reason.value}); "
            "replacing it (not counted against backoffLimit)",
        )
    d = ledger.account(ctx, d, (s.uid for s in fresh))
    return ledger.back_off(ctx, d) if hit else d


def _order(pod: PodView) -> tuple[int, str]:
    return (pod.index or 0, pod.name)
