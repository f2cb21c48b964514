"""Warm spares (``spec.warmSpares``): prewarmed worker pods kept beyond ``desired``.

Where it sits: pure steps of the planner's pass (``planner._Pass``), like
``verdicts`` and ``lifecycle``. A spare is a worker pod annotated
``torchflex.io/standby: "true"``: its agent imports torch and starts its
fork server, then waits outside the rendezvous until the annotation (a
downward-API file, ``builders``) reads anything else. The pass sees spares
apart from members (``_Pass.spares``): they are never counted as replicas,
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
from typing import TYPE_CHECKING

from torchflex_contract import labels
from torchflex_operator.model.observed import PodView
from torchflex_operator.model.plan import PodPromote
from torchflex_operator.model.vocabulary import EventReason, EventType, Reason
from torchflex_operator.planning.rules import pacing, rollout
from torchflex_operator.planning.rules.failures import classify
from torchflex_operator.render import builders, podgroup

if TYPE_CHECKING:
    from torchflex_operator.planning.pipeline import _Pass


def wanted(p: _Pass) -> int:
    """Spares the job keeps now: only room to grow (``maxReplicas - desired``) is filled;
    in a Kueue queue, only room within the admitted count (Kueue's quota covers no more)."""
    top = p.job.max_replicas
    if p.obs.queue is not None:
        top = min(top, p.obs.queue.count)
    return max(0, min(p.job.warm_spares, top - p.job.desired))


def promote(p: _Pass) -> None:
    """Spares at an index below ``desired`` become members (a scale-up reached them)."""
    for spare in list(p.spares):
        if not spare.active or (spare.index or 0) >= p.job.desired:
            continue
        p.plan.promote_pods.append(PodPromote(spare.name, spare.uid))
        p.plan.event(
            EventType.NORMAL,
            EventReason.SPARE_PROMOTED,
            f"promoted warm spare {spare.name} to a member",
        )
        # A member from here on, in this very pass (counts, scale, availability).
        p.spares.remove(spare)
        p.workers = sorted([*p.workers, replace(spare, standby=False)], key=_order)


def keep(p: _Pass, held: bool) -> None:
    """Delete spares that failed, are out of date or out of range; create the missing ones."""
    job, want = p.job, wanted(p)
    top = job.desired + want  # spares live at indices desired .. top - 1
    current = builders.template_hash(job)
    failed = [s for s in p.spares if s.phase == "Failed"]
    for spare in p.spares:
        if spare.terminating:
            continue
        if spare.finished or rollout.outdated(spare, current) or (spare.index or 0) >= top:
            p.plan.delete(spare)
    _back_off(p, failed)
    live = [s for s in p.spares if s.active and (s.index or 0) < top and s not in failed]
    live = [s for s in live if not rollout.outdated(s, current)]
    missing = want - len(live)
    leaving = {d.name for d in p.plan.delete_pods}
    members = sum(1 for w in p.workers if w.active and w.name not in leaving)
    until = p.s.backoff_until
    if missing <= 0 or held or members < job.desired:
        return  # members first: a spare never takes a place a member needs
    if until is not None and until > p.now:
        p.plan.wake_in((until - p.now).total_seconds())
        return
    created = sum(
        1
        for m in p.plan.create_pods
        if m["metadata"]["labels"].get(labels.Label.ROLE) == labels.Role.WORKER
    )
    budget = pacing.budget(
        [*p.workers, *p.spares], p.settings, podgroup.pods_at_once(job, p.settings)
    )
    occupied = {w.index for w in (*p.workers, *p.spares)}
    free = [i for i in range(job.desired, top) if i not in occupied]
    take = free[: max(0, min(missing, budget.allowed - created))]
    for index in take:
        p.plan.create_pods.append(builders.worker_pod(job, index, p.settings, spare=True))
    if take:
        names = ", ".join(labels.worker_pod_name(job.name, i) for i in take)
        p.plan.event(EventType.NORMAL, EventReason.CREATED_POD, f"created warm spare {names}")


def retire(p: _Pass) -> None:
    """A job that trains no more keeps no spare, whatever ``cleanPodPolicy`` says:
    a spare would otherwise wait for a promotion that never comes."""
    for spare in p.spares:
        if not spare.terminating:
            p.plan.delete(spare)


def _back_off(p: _Pass, failed: list[PodView]) -> None:
    """A newly failed spare starts the usual replacement backoff, uncounted."""
    accounted = list(p.s.accounted_pods or ())
    fresh = [s for s in failed if s.uid not in accounted]
    if not fresh:
        return
    hit = False
    for spare in fresh:
        accounted.append(spare.uid)
        failure = classify(spare, p.obs)
        if failure.reason is Reason.POD_DELETED:
            continue  # deleted on purpose (out of range, out of date): no fault
        hit = True
        p.plan.event(
            EventType.WARNING,
            EventReason.REPLACED_POD,
            f"warm spare {spare.name} ended ({failure.reason.value}); "
            "replacing it (not counted against backoffLimit)",
        )
    p.s = replace(p.s, accounted_pods=tuple(accounted[-p.settings.accounted_pods_kept :]))
    if hit:
        p.back_off()


def _order(pod: PodView) -> tuple[int, str]:
    return (pod.index or 0, pod.name)
