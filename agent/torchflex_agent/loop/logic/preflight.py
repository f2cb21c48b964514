"""Whether a node passes its opt-in check before joining (pure).

Where it sits: ``loop.preflight`` runs the check (a timed matmul on each of the
node's devices, each result compared with the CPU's) and asks ``verdict`` with
its figure and the figures of the agents that passed before it (read from the
store). A node whose device computed a wrong result, or whose slowest device
reaches less than ``1 / MAX_SLOWDOWN`` of the peers' median, does not join: its
agent exits ``ExitCode.BAD_NODE`` and the operator replaces its pod elsewhere.
The first agents have no peers to compare with and pass on a correct result.

The peer half: ``link_verdict`` judges the timed all_reduce the node ran with a
node checking at the same time (``rendezvous.node_check.pair``): a failed or
timed out collective, or a wrong sum, fails it (naming the peer); so does a bus
bandwidth below ``1 / MAX_SLOWDOWN`` of the median of the agents that passed
with a peer before it. A node with no peer passes on its compute half alone.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Sequence

MAX_SLOWDOWN = 2.0
"""A node this many times slower than its peers' median does not join."""


@dataclasses.dataclass(frozen=True)
class DeviceFigure:
    device: str
    gflops: float
    correct: bool


@dataclasses.dataclass(frozen=True)
class Verdict:
    ok: bool
    gflops: float
    reason: str


def parse_figures(text: str) -> list[DeviceFigure]:
    """The check program's JSON output; ValueError if malformed or empty."""
    raw = json.loads(text)
    if not isinstance(raw, list) or not raw:
        raise ValueError("expected a non-empty JSON list of device figures")
    return [
        DeviceFigure(str(d["device"]), float(d["gflops"]), d.get("correct") is True) for d in raw
    ]


def verdict(figures: Sequence[DeviceFigure], peers: Sequence[float]) -> Verdict:
    """Pass or fail, with the node's figure (its slowest device) and why."""
    wrong = [f.device for f in figures if not f.correct]
    slowest = min(f.gflops for f in figures)
    if wrong:
        return Verdict(False, slowest, f"device(s) {', '.join(wrong)} computed a wrong matmul")
    if not peers:
        return Verdict(True, slowest, f"{slowest:.1f} GFLOP/s (no peer to compare with yet)")
    median = statistics.median(peers)
    text = f"{slowest:.1f} GFLOP/s against a median of {median:.1f} over {len(peers)} peer(s)"
    if slowest * MAX_SLOWDOWN < median:
        return Verdict(False, slowest, f"too slow: {text} (limit {MAX_SLOWDOWN:g}x slower)")
    return Verdict(True, slowest, text)


@dataclasses.dataclass(frozen=True)
class LinkFigure:
    """The check program's all_reduce with a peer: bus bandwidth, sum correct, or why it failed."""

    gbps: float
    correct: bool
    error: str = ""


@dataclasses.dataclass(frozen=True)
class LinkVerdict:
    ok: bool
    gbps: float | None
    """None: no peer was checking at the same time (nothing to publish)."""
    reason: str


def parse_link(text: str) -> LinkFigure:
    """The collective program's JSON output; ValueError if malformed."""
    raw = json.loads(text)
    if not isinstance(raw, dict):
        raise ValueError("expected a JSON object with the collective's figures")
    return LinkFigure(float(raw["gbps"]), raw.get("correct") is True, str(raw.get("error") or ""))


def link_verdict(link: LinkFigure | None, peer: str, peers: Sequence[float]) -> LinkVerdict:
    """Pass or fail on the collective with ``peer``, against the bandwidths in ``peers``."""
    if link is None:
        return LinkVerdict(True, None, "no peer checking at the same time")
    if link.error:
        return LinkVerdict(False, None, f"all_reduce with {peer} failed: {link.error}")
    text = f"all_reduce with {peer}: {link.gbps:.3f} GB/s bus bandwidth"
    if not link.correct:
        return LinkVerdict(False, link.gbps, f"{text}, wrong sum")
    if not peers:
        return LinkVerdict(True, link.gbps, f"{text} (no peer bandwidth to compare with yet)")
    median = statistics.median(peers)
    text = f"{text} against a median of {median:.3f} over {len(peers)} node(s)"
    if link.gbps * MAX_SLOWDOWN < median:
        return LinkVerdict(False, link.gbps, f"too slow: {text} (limit {MAX_SLOWDOWN:g}x slower)")
    return LinkVerdict(True, link.gbps, text)
