"""Stragglers the agents named, as the job's status shows them.

Where it sits: a rule ``steps.stragglers`` consults each live pass. The agent
holding node rank 0 compares every node's mean forward time over a window and
names the nodes at twice the others' median or more, window after window
(``AgentReport.stragglers``, read from its live ``GET /status``). ``newest``
takes the newest round's; ``current`` maps them to the job's member pods;
``merge`` keeps each one's first-seen time for ``status.stragglers`` and says
which are new (one ``StragglerDetected`` Event each); ``mark_replaced`` and
``avoid`` record what the Replace policy did (``status.avoidedNodes``, bounded).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence

from torchflex_contract.progress import AgentReport, StragglerReport
from torchflex_operator.model.observed import PodView
from torchflex_operator.model.status import Straggler

AVOIDED_KEPT = 16
"""Nodes ``status.avoidedNodes`` keeps (the newest)."""


def newest(reports: Mapping[str, AgentReport]) -> list[StragglerReport]:
    """The stragglers named in the newest round any report compares."""
    named = [st for report in reports.values() for st in report.stragglers]
    if not named:
        return []
    top = max(st.round for st in named)
    return [st for st in named if st.round == top]


def current(
    named: Sequence[StragglerReport],
    members: Sequence[PodView],
    known: tuple[Straggler, ...] | None,
) -> list[tuple[PodView, StragglerReport]]:
    """The members ``named`` refers to; not a pod already replaced for that round (a
    replacement under its name is a new pod the report has never compared)."""
    done = {(e.pod, e.round) for e in known or () if e.replaced}
    by_pod = {pod.name: pod for pod in members if pod.deletion is None}
    out: dict[str, tuple[PodView, StragglerReport]] = {}
    for st in named:
        pod = by_pod.get(st.pod)
        if pod is not None and (st.pod, st.round) not in done:
            out[pod.name] = (pod, st)
    return [out[name] for name in sorted(out)]


def merge(
    known: tuple[Straggler, ...] | None,
    named: Sequence[StragglerReport],
    found: Sequence[tuple[PodView, StragglerReport]],
    now: dt.datetime,
) -> tuple[tuple[Straggler, ...] | None, list[Straggler]]:
    """(the new ``status.stragglers``, the entries new this pass: one Event each).

    Replaced entries stay while reports of their round still name them."""
    still = {(st.pod, st.round) for st in named}
    kept = [e for e in known or () if e.replaced and (e.pod, e.round) in still]
    since = {entry.pod: entry.since for entry in known or () if not entry.replaced}
    entries = [
        Straggler(
            pod=pod.name,
            node=pod.node_name or "",
            node_rank=st.node_rank,
            forward_seconds=st.forward_s,
            ratio=st.ratio,
            since=since.get(pod.name) or now,
            round=st.round,
        )
        for pod, st in found
    ]
    fresh = [e for e in entries if e.pod not in since]
    return (tuple([*kept, *entries]) or None), fresh


def mark_replaced(listed: tuple[Straggler, ...] | None, pod: str) -> tuple[Straggler, ...] | None:
    """``status.stragglers`` with ``pod``'s entry marked replaced."""
    if listed is None:
        return None
    return tuple(dataclasses.replace(e, replaced=True) if e.pod == pod else e for e in listed)


def avoid(known: tuple[str, ...] | None, node: str) -> tuple[str, ...]:
    """``status.avoidedNodes`` with ``node`` added (once; the oldest go first)."""
    nodes = [n for n in known or () if n != node]
    return tuple([*nodes, node][-AVOIDED_KEPT:])


def event_message(entry: Straggler) -> str:
    return (
        f"pod {entry.pod} on node {entry.node or '?'} is a straggler: its forward passes take "
        f"{entry.forward_seconds or 0:.4f} s, {entry.ratio or 0:.1f}x the other nodes' median"
    )
