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

from torchflex_operator.model.spec import StragglerPolicy
from torchflex_operator.model.vocabulary import EventReason, EventType
from torchflex_operator.planning.context import Ctx, Draft
from torchflex_operator.planning.rules import stragglers as rules


def stragglers(ctx: Ctx, d: Draft) -> Draft:
    found = rules.current(ctx.obs.reports, d.members)
    listed, fresh = rules.merge(d.status.stragglers, found, ctx.stamp)
    d = d.with_status(stragglers=listed)
    for entry in fresh:
        d = d.event(EventType.WARNING, EventReason.STRAGGLER_DETECTED, rules.event_message(entry))
    if ctx.job.straggler_policy is not StragglerPolicy.REPLACE:
        return d
    staying = sum(1 for pod in d.members if pod.deletion is None)
    since = {entry.pod: entry.since for entry in listed or ()}
    new = {entry.pod for entry in fresh}
    for pod, _st in found:
        named = since.get(pod.name)
        # A pod created after it was named is a replacement under the same name, judged
        # by a report of the round before it: not the straggler.
        if pod.deletion is not None or (pod.created and named and pod.created > named):
            continue
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
        if pod.node_name:
            d = d.with_status(avoided_nodes=rules.avoid(d.status.avoided_nodes, pod.node_name))
        d = d.event(
            EventType.WARNING,
            EventReason.STRAGGLER_REPLACED,
            f"deleted straggler pod {pod.name}; new pods are kept off node "
            f"{pod.node_name or '?'} (status.avoidedNodes)",
        )
    return d
