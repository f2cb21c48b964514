"""The goodput benchmark's chaos schedule: which node fails when, and when it comes back.

Where it sits: ``benchmarks.goodput`` computes the schedule once per
repetition from its seed and plays the very same list against every launcher
(torchflex, torchrun default and tuned, and later the state API), so the
launchers are compared under identical churn. Pure: no clock, no processes,
no global random state (a ``random.Random(seed)`` of its own); table-tested
in ``tests/unit/benchmarks/test_goodput_chaos.py``.

The schedule, for a job of ``nodes`` node slots over ``duration`` seconds:

* a fault every ``every`` seconds (at ``every``, ``2*every``, ... while
  before ``duration``): one of ``actions`` (``kill``: SIGKILL of the node's
  process tree; ``freeze``: SIGSTOP of it) on one slot that is up, both drawn
  from the seed;
* ``down`` seconds after each fault, a ``replace`` event for that slot (the
  driver kills whatever is left of the old node, a frozen tree for instance,
  and starts a new launcher in the slot), if that time is before
  ``duration``;
* a slot in ``protected`` is never a victim (the driver protects slot 0:
  under torchrun it hosts the rendezvous store, whose loss ends a torchrun
  job for good; see ``benchmarks.goodput``);
* a fault is skipped (no event) while no more than ``min_up`` slots are up,
  so the job is never pushed below its minimum size by the schedule alone.

Times are seconds from the start of the chaos window. Events come sorted by
time; at equal times a replacement comes before a fault, so a slot replaced
at ``t`` may fail again at ``t``.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import Final

KILL: Final = "kill"
FREEZE: Final = "freeze"
REPLACE: Final = "replace"
FAULTS: Final = (KILL, FREEZE)
_ORDER: Final = {REPLACE: 0, KILL: 1, FREEZE: 1}


@dataclasses.dataclass(frozen=True, order=True)
class ChaosEvent:
    """At ``time`` seconds into the chaos window, ``action`` on node slot ``node``."""

    time: float
    action: str
    node: int


def chaos_schedule(
    seed: int,
    duration: float,
    every: float,
    down: float,
    nodes: int,
    *,
    actions: Sequence[str] = FAULTS,
    protected: frozenset[int] = frozenset(),
    min_up: int = 1,
) -> list[ChaosEvent]:
    """The events of one chaos window; the same arguments give the same list, always."""
    if every <= 0 or down <= 0 or duration <= 0:
        raise ValueError(f"every, down, duration must be > 0, got {every}, {down}, {duration}")
    if nodes < 1 or min_up < 0:
        raise ValueError(f"need nodes >= 1 and min_up >= 0, got {nodes}, {min_up}")
    unknown = [a for a in actions if a not in FAULTS]
    if unknown or not actions:
        raise ValueError(f"actions must be a non-empty subset of {FAULTS}, got {list(actions)}")
    rng = random.Random(seed)
    back_at: dict[int, float] = {}  # slot -> when its replacement starts
    events: list[ChaosEvent] = []
    tick = 1
    while (t := float(tick * every)) < duration:
        tick += 1
        for slot in [s for s, at in back_at.items() if at <= t]:
            del back_at[slot]
        up = [s for s in range(nodes) if s not in back_at]
        victims = [s for s in up if s not in protected]
        if len(up) <= min_up or not victims:
            continue
        action = rng.choice(list(actions))
        victim = rng.choice(victims)
        events.append(ChaosEvent(t, action, victim))
        back_at[victim] = t + down
        if t + down < duration:
            events.append(ChaosEvent(t + down, REPLACE, victim))
    return sorted(events, key=lambda e: (e.time, _ORDER[e.action], e.node))
