"""The pass's bookkeeping steps on status: the generation every condition was weighed
against, the replica counts (a multi-role job's per role), and the Events the status
carries until posted.

Where it sits: pure steps ``(Ctx, Draft) -> Draft`` at the end of the planner's
pipeline, whatever branch the pass took.
"""

from __future__ import annotations

from dataclasses import replace

from torchflex_contract import labels
from torchflex_operator.model.status import RoleStatus
from torchflex_operator.planning.context import Ctx, Draft, completion_group
from torchflex_operator.planning.rules import events, rollout
from torchflex_operator.planning.rules.failures import succeeded
from torchflex_operator.render import builders


def generations(ctx: Ctx, d: Draft) -> Draft:
    """Every condition was weighed against this spec, kept or changed (metav1.Condition)."""
    gen = ctx.job.generation
    conds = tuple(replace(c, observed_generation=gen) for c in d.status.conditions or ())
    return d.with_status(conditions=conds)


def counts(ctx: Ctx, d: Draft) -> Draft:
    """Replicas, ready and updated members, restarts, the round and world size (of a
    multi-role job: the completion role's round and world size)."""
    s = d.status
    active = [w for w in d.members if w.active]
    # Each worker group against its own spec hash (a role's pods carry their role's).
    current = {view.role: builders.template_hash(view) for view in ctx.job.role_views()}
    restarts = s.restarts or 0
    rnd = -1 if s.rendezvous_round is None else s.rendezvous_round
    world = s.world_size or 0
    # Finished members' final reports count: a job done between polls keeps its
    # world size, and a failed one the restarts and round its agents ended with.
    names = {w.name for w in d.members if w.active or succeeded(w) or w.phase == "Failed"}
    rounds = names & completion_group(ctx, d)
    reports = [r for n, r in ctx.obs.reports.items() if n in rounds and r.round >= 0]
    if reports:
        rnd = max(r.round for r in reports)
        world = max(r.world_size for r in reports if r.round == rnd)
    every = [r for n, r in ctx.obs.reports.items() if n in names and r.round >= 0]
    if every:
        restarts = max(restarts, *(r.restarts for r in every))
    # With roles, the scale subresource (and so an HPA) drives the scale role's pods.
    scaled = ctx.job.scale_role_name if ctx.job.multi_role else None
    return d.with_status(
        replicas=len(active),
        ready_replicas=sum(1 for w in active if w.ready),
        updated_replicas=sum(
            1 for w in active if not rollout.outdated(w, current.get(w.group or "", ""))
        ),
        selector=labels.worker_selector(ctx.job.name, scaled),
        observed_generation=ctx.job.generation,
        failures=s.failures or 0,
        replacements=s.replacements or 0,
        restarts=restarts,
        rendezvous_round=rnd,
        world_size=world,
        warm_spares=(
            sum(1 for w in d.spares if w.running) if ctx.job.keeps_spares or d.spares else None
        ),
    )


def settle_events(ctx: Ctx, d: Draft) -> Draft:
    """Carry this pass's Events in the status until posted (``rules.events``)."""
    decided = [(e.type, e.reason.value, e.message) for e in d.events]
    return replace(d, status=events.settle(d.status, ctx.prior, decided, ctx.obs.posted_events))


def roles(ctx: Ctx, d: Draft) -> Draft:
    """``status.roles`` of a multi-role job: each role's desired count, its pods and
    what its agents last reported (absent for a job of one group)."""
    if not ctx.job.multi_role:
        return d
    out: list[RoleStatus] = []
    for view in ctx.job.role_views():
        pods = [w for w in ctx.obs.workers(view.role) if not w.standby]
        active = [w for w in pods if w.active]
        names = {w.name for w in pods}
        reports = [r for n, r in ctx.obs.reports.items() if n in names and r.round >= 0]
        rnd = max((r.round for r in reports), default=-1)
        world = max((r.world_size for r in reports if r.round == rnd), default=0)
        out.append(
            RoleStatus(
                name=view.role,
                desired=view.desired,
                replicas=len(active),
                ready=sum(1 for w in active if w.ready),
                world_size=world,
                round=rnd,
            )
        )
    summary = " ".join(f"{r.name} {r.ready}/{r.desired}" for r in out)
    return d.with_status(roles=tuple(out), role_summary=summary)
