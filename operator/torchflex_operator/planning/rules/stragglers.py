"""Stragglers the agents named, as the job's status shows them.

Where it sits: a rule ``steps.stragglers`` consults each live pass. The agent
holding node rank 0 compares every node's mean forward time over a window and
names the nodes at twice the others' median or more, window after window
(``AgentReport.stragglers``, read from its live ``GET /status``). ``current``
maps them to the job's member pods; ``merge`` keeps each one's first-seen
time for ``status.stragglers`` and says which are new (one ``StragglerDetected``
Event each); ``avoid`` adds a node to ``status.avoidedNodes`` (bounded).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

from torchflex_contract.progress import AgentReport, StragglerReport
from torchflex_operator.model.observed import PodView
from torchflex_operator.model.status import Straggler

AVOIDED_KEPT = 16
"""Nodes ``status.avoidedNodes`` keeps (the newest)."""


def current(
    reports: Mapping[str, AgentReport], members: Sequence[PodView]
) -> list[tuple[PodView, StragglerReport]]:
    """The members named stragglers in the newest round any report compares."""
    named = [st for report in reports.values() for st in report.stragglers]
    if not named:
        return []
    newest = max(st.round for st in named)
    by_pod = {pod.name: pod for pod in members}
    out: dict[str, tuple[PodView, StragglerReport]] = {}
    for st in named:
        pod = by_pod.get(st.pod)
        if st.round == newest and pod is not None:
            out[pod.name] = (pod, st)
    return [out[name] for name in sorted(out)]


def merge(
    known: tuple[Straggler, ...] | None,
    found: Sequence[tuple[PodView, StragglerReport]],
    now: dt.datetime,
) -> tuple[tuple[Straggler, ...] | None, list[Straggler]]:
    """(the new ``status.stragglers``, the entries new this pass: one Event each)."""
    since = {entry.pod: entry.since for entry in known or ()}
    entries = [
        Straggler(
            pod=pod.name,
            node=pod.node_name or "",
            node_rank=st.node_rank,
            forward_seconds=st.forward_s,
            ratio=st.ratio,
            since=since.get(pod.name) or now,
        )
        for pod, st in found
    ]
    fresh = [e for e in entries if e.pod not in since]
    return (tuple(entries) or None), fresh


def avoid(known: tuple[str, ...] | None, node: str) -> tuple[str, ...]:
    """``status.avoidedNodes`` with ``node`` added (once; the oldest go first)."""
    nodes = [n for n in known or () if n != node]
    return tuple([*nodes, node][-AVOIDED_KEPT:])


def event_message(entry: Straggler) -> str:
    return (
        f"pod {entry.pod} on node {entry.node or '?'} is a straggler: its forward passes take "
        f"{entry.forward_seconds or 0:.4f} s, {entry.ratio or 0:.1f}x the other nodes' median"
    )
