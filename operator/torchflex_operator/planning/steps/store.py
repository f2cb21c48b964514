"""Steps on the job's rendezvous store: keep its host pod, and watch the agents reach it.

Where it sits: pure steps ``(Ctx, Draft) -> Draft`` of the planner's pipeline. The
host pod comes from the backend registry (``render.backends``): none when the agents
dial the user's own store. The agents' store errors come from their reports
(``rules.fencing.store_health``).
"""

from __future__ import annotations

from torchflex_contract.labels import PodKind
from torchflex_operator.model.observed import PodView
from torchflex_operator.model.timestamps import format_time
from torchflex_operator.model.vocabulary import ConditionType, EventReason, EventType, Reason
from torchflex_operator.planning.context import Ctx, Draft
from torchflex_operator.planning.rules import fencing
from torchflex_operator.render import backends


def rendezvous_host(ctx: Ctx, d: Draft) -> Draft:
    """Keep the backend's host pod: replace a finished one, recreate a lost one."""
    job = ctx.job
    host = backends.host(job)
    if host is None:  # the user's own store: nothing to run
        return d
    role, name = host.role, host.pod_name
    pods = [p for p in ctx.obs.of_kind(role) if p.name == name]
    for pod in pods:
        if pod.finished and not pod.terminating:
            d = d.delete(pod)
    # Planned already: by the role before, in a multi-role job's pass.
    if pods or d.held or any(m["metadata"]["name"] == name for m in d.create_pods):
        return d
    if d.status.rendezvous_host:
        d = d.event(
            EventType.WARNING,
            EventReason.RENDEZVOUS_HOST_LOST,
            f"rendezvous host {name} was lost; recreating it (agents re-rendezvous)",
        )
    else:
        d = d.event(EventType.NORMAL, EventReason.STORE_CREATED, f"created {name}")
    d = d.with_status(rendezvous_host=name)
    return d.create(host.build(job, ctx.settings))


def _host(ctx: Ctx, d: Draft) -> PodView | None:
    hosts = [*ctx.obs.of_kind(PodKind.STORE), *ctx.obs.of_kind(PodKind.ETCD)]
    return next((h for h in hosts if h.name == d.status.rendezvous_host), None)


def liveness(ctx: Ctx, d: Draft) -> Draft:
    """``StoreReachable`` from the agents' store errors; a store most agents cannot reach
    for ``store_replace_after_s`` while its pod runs is replaced."""
    health = fencing.store_health(d.members, ctx.obs.reports)
    ctype = ConditionType.STORE_REACHABLE
    if not health.unreachable:
        running = sum(1 for w in d.members if w.running)
        if 2 * health.reporting <= running:
            # Too few answers to clear it (agents stuck in a store call may not
            # answer; a replacement that has not tried the store says nothing).
            return d
        if d.turns(ctype, True):
            if d.condition(ctype) is not None:
                d = d.event(
                    EventType.NORMAL, EventReason.STORE_REACHABLE, "agents reach the store again"
                )
            d = d.set_condition(
                ctx,
                ctype,
                status=True,
                reason=Reason.STORE_REACHABLE,
                message="no agent reports a store error",
            )
        return d.with_status(store_unreachable_since=None)
    began = d.status.store_unreachable_since or ctx.stamp
    d = d.with_status(store_unreachable_since=began)
    since = ctx.since(began) or 0.0
    message = f"{health.message}; since {format_time(began)}"
    if d.turns(ctype, False):
        d = d.event(EventType.WARNING, EventReason.STORE_UNREACHABLE, message)
    d = d.set_condition(ctx, ctype, status=False, reason=Reason.STORE_UNREACHABLE, message=message)
    host = _host(ctx, d)
    if not health.majority_blind or host is None or not host.running:
        return d
    bound = ctx.settings.store_replace_after_s
    host_age = (ctx.now - host.created).total_seconds() if host.created else bound
    left = bound - min(since, host_age)
    if left > 0:
        return d.wake_in(left)
    d = d.delete(host, grace_s=min(host.grace_s, ctx.settings.fence_grace_s))
    return d.event(
        EventType.WARNING,
        EventReason.REPLACING_STORE,
        f"agents have been unable to reach the rendezvous store for {since:.0f}s "
        f"({health.message}) while pod {host.name} runs: replacing it",
    )
