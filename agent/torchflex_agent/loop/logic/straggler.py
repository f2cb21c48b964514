"""Which node is much slower than the others (pure).

Where it sits: ``loop.stalls.StallWatch`` publishes, every ``WINDOW_S``, its
node's mean forward time over the window (``window_mean`` of its workers'
pulses); the member holding node rank 0 reads every node's figure and feeds
``StragglerTracker``, whose ``flagged`` nodes go into its report
(``AgentReport.stragglers``).

The signal: the wall time of each outermost forward pass, which a rank
computes alone (its backward meets the others in all-reduce, where a fast
rank waits for the slow one, so step times are equal everywhere and say
nothing). A node is a straggler when its forward takes ``RATIO`` times the
median of the *other* nodes' (so two nodes suffice) for ``WINDOWS``
consecutive windows. Blind spots: on a GPU a forward returns once its
kernels are queued, so this times the launch, not the device (a throttled GPU
shows only once the queue is full); and it sees compute only, not a slow
link (that is the all-reduce, which every rank waits on alike).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping

RATIO = 2.0
"""How many times the others' median a node's forward must take to be a straggler."""
WINDOWS = 3
"""Consecutive windows a node must be that slow (a one-off hiccup is not a straggler)."""
WINDOW_S = 10.0
"""Seconds between two publications of a node's forward time."""
MIN_FORWARDS = 3
"""Forwards a window needs before its mean is trusted."""


def window_mean(before: tuple[float, int], after: tuple[float, int]) -> float | None:
    """Mean forward seconds between two (total seconds, forwards) reads of one worker."""
    (t0, n0), (t1, n1) = before, after
    if n1 - n0 < MIN_FORWARDS or t1 < t0:
        return None
    return (t1 - t0) / (n1 - n0)


def ratios(times: Mapping[int, float]) -> dict[int, float]:
    """Each node's forward time over the median of the other nodes' (needs two nodes)."""
    out: dict[int, float] = {}
    for node, seconds in times.items():
        others = [t for n, t in times.items() if n != node]
        if not others:
            continue
        median = statistics.median(others)
        if median > 0:
            out[node] = seconds / median
    return out


@dataclasses.dataclass(frozen=True)
class Straggling:
    """A node found slow, with the figures of its latest window."""

    node_rank: int
    forward_s: float
    ratio: float
    windows: int


@dataclasses.dataclass(frozen=True)
class StragglerTracker:
    """How many windows in a row each node has been slow."""

    streaks: tuple[tuple[int, int], ...] = ()

    def observe(self, times: Mapping[int, float]) -> tuple[StragglerTracker, list[Straggling]]:
        """The tracker after one window, and the nodes slow for ``WINDOWS`` windows now."""
        got = ratios(times)
        old = dict(self.streaks)
        streaks = {node: old.get(node, 0) + 1 for node, r in got.items() if r >= RATIO}
        flagged = [
            Straggling(node, times[node], round(got[node], 2), n)
            for node, n in sorted(streaks.items())
            if n >= WINDOWS
        ]
        return StragglerTracker(tuple(sorted(streaks.items()))), flagged
