"""The step that names stragglers and, when the job asks, replaces them.

Where it sits: a pure step ``(Ctx, Draft) -> Draft`` of the planner's pipeline
(live passes). What counts as a straggler is the agents' call (node rank 0's
report, ``rules.stragglers``); this step writes ``status.stragglers`` with one
``StragglerDetected`` Event per newly named pod. With
``spec.stragglerPolicy: Replace`` it also deletes the straggler's pod (a normal,
graceful delete: its agent leaves and the group re-forms without it) and adds
its node to ``status.avoidedNodes``, which every pod created from then on is
kept off (``render.builders.worker_pod``), so a bad node does not come back at
the next scheduling. It never takes the job below ``minReplicas``: then the
Event says the straggler was kept.
"""

from __future__ import annotations

from torchflex_contract.progress import StragglerReport
from torchflex_operator.model.observed import PodView
from torchflex_operator.model.spec import StragglerPolicy
from torchflex_operator.model.status import Straggler
from torchflex_operator.model.vocabulary import EventReason, EventType
from torchflex_operator.planning.context import Ctx, Draft
from torchflex_operator.planning.rules import stragglers as rules


def stragglers(ctx: Ctx, d: Draft) -> Draft:
    named = rules.newest(ctx.obs.reports)
    found = rules.current(named, d.members, d.status.stragglers)
    listed, fresh = rules.merge(d.status.stragglers, named, found, ctx.stamp)
    for entry in fresh:
        d = d.event(EventType.WARNING, EventReason.STRAGGLER_DETECTED, rules.event_message(entry))
    if ctx.job.straggler_policy is StragglerPolicy.REPLACE:
        d, listed = _replace(ctx, d, found, listed, {e.pod for e in fresh})
    return d.with_status(stragglers=listed)


def _replace(
    ctx: Ctx,
    d: Draft,
    found: list[tuple[PodView, StragglerReport]],
    listed: tuple[Straggler, ...] | None,
    new: set[str],
) -> tuple[Draft, tuple[Straggler, ...] | None]:
    staying = sum(1 for pod in d.members if pod.deletion is None)
    for pod, _st in found:
        if staying - 1 < ctx.job.min_replicas:
            if pod.name in new:
                d = d.event(
                    EventType.WARNING,
                    EventReason.STRAGGLER_REPLACED,
                    f"straggler pod {pod.name} kept: without it the job would fall below "
                    f"minReplicas ({ctx.job.min_replicas})",
                )
            continue
        staying -= 1
        d = d.delete(pod)
        listed = rules.mark_replaced(listed, pod.name)
        if pod.node_name:
            d = d.with_status(avoided_nodes=rules.avoid(d.status.avoided_nodes, pod.node_name))
        d = d.event(
            EventType.WARNING,
            EventReason.STRAGGLER_REPLACED,
            f"deleted straggler pod {pod.name}; new pods are kept off node "
            f"{pod.node_name or '?'} (status.avoidedNodes)",
        )
    return d, listed
