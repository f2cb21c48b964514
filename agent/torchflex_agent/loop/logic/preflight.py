"""Whether a node passes its opt-in check before joining (pure).

Where it sits: ``loop.preflight`` runs the check (a timed matmul on each of the
node's devices, each result compared with the CPU's) and asks ``verdict`` with
its figure and the figures of the agents that passed before it (read from the
store). A node whose device computed a wrong result, or whose slowest device
reaches less than ``1 / MAX_SLOWDOWN`` of the peers' median, does not join: its
agent exits ``ExitCode.BAD_NODE`` and the operator replaces its pod elsewhere.
The first agents have no peers to compare with and pass on a correct result.
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
