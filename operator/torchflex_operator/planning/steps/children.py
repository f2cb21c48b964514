"""Steps on the job's other children: its Services and NetworkPolicy, and the creates
the API server refused.

Where it sits: pure steps ``(Ctx, Draft) -> Draft`` of the planner's pipeline.
``refusals`` runs first of these: while a refused create waits (``Draft.held``) the
later steps create nothing.
"""

from __future__ import annotations

from dataclasses import replace

from torchflex_operator.model.vocabulary import ConditionType, EventReason, EventType, Phase, Reason
from torchflex_operator.planning.context import Ctx, Draft, finish
from torchflex_operator.render import builders, netpol


def services(ctx: Ctx, d: Draft) -> Draft:
    """Create the job's Services that are missing (once: each role of a multi-role job
    runs this step)."""
    planned = {svc["metadata"]["name"] for svc in d.create_services}
    missing = tuple(
        svc
        for svc in builders.services(ctx.job)
        if svc["metadata"]["name"] not in ctx.obs.services
        and svc["metadata"]["name"] not in planned
    )
    return replace(d, create_services=(*d.create_services, *missing)) if missing else d


def network_policy(ctx: Ctx, d: Draft) -> Draft:
    """Keep the job's NetworkPolicy while enabled, delete it once opted out."""
    job = ctx.job
    name = netpol.policy_name(job.name)
    planned = {p["metadata"]["name"] for p in d.create_network_policies}
    present = name in ctx.obs.network_policies or name in planned
    if job.network_policy and not present:
        policy = netpol.network_policy(job, ctx.settings)
        return replace(d, create_network_policies=(*d.create_network_policies, policy))
    if not job.network_policy and present and name not in d.delete_network_policies:
        return replace(d, delete_network_policies=(*d.delete_network_policies, name))
    return d


def refusals(ctx: Ctx, d: Draft) -> Draft:
    """Condition and Events for refused creates; ``Draft.held`` while creation should wait.

    A 400/422 fails the job now: the same spec builds the same invalid
    object. A 403 from admission (Pod Security, quota) may clear by itself:
    creation is retried every ``refusal_retry_s`` and ``minAvailableTimeout``
    bounds the wait.
    """
    ctype = ConditionType.CHILDREN_ACCEPTED
    refused = sorted(ctx.obs.refusals.values(), key=lambda r: r.at)
    if not refused:
        if d.condition(ctype) is not None and d.turns(ctype, True):
            d = d.set_condition(
                ctx,
                ctype,
                status=True,
                reason=Reason.ACCEPTED,
                message="every object was created",
            )
        return replace(d, held=False)
    last = refused[-1]
    message = f"the API server refused {last.kind} {last.name} (HTTP {last.code}): {last.message}"
    if d.turns(ctype, False, message):
        d = d.event(EventType.WARNING, EventReason.CREATE_REFUSED, message)
    d = d.set_condition(ctx, ctype, status=False, reason=Reason.CREATE_REFUSED, message=message)
    permanent = next((r for r in refused if r.permanent), None)
    if permanent is not None:
        d = finish(
            ctx,
            d,
            Phase.FAILED,
            Reason.CHILD_REJECTED,
            f"the API server rejected {permanent.kind} {permanent.name} "
            f"(HTTP {permanent.code}): {permanent.message}",
        )
        return replace(d, held=True)
    wait = ctx.settings.refusal_retry_s - (ctx.now - last.at).total_seconds()
    if wait > 0:
        return replace(d.wake_in(wait), held=True)
    return replace(d, held=False)
