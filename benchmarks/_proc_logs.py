"""Pure parsing and arithmetic of the process-level recovery and preemption benchmarks.

Where it sits: ``benchmarks._proc_job`` collects the output lines of real
agents (torchflex-agent or stock torchrun) running ``examples/train_elastic.py
--print-time``; ``benchmarks.recovery`` and ``benchmarks.preemption`` turn
those lines into numbers with the functions here. No I/O, no clocks: unit-
tested in ``tests/unit/benchmarks/test_recovery_logs.py``.

Definitions (written into RESULTS.md by the drivers):

* a *step line* is the example's ``step=N loss=X world=W rank=R sps=S t=T``,
  possibly behind a launcher prefix (``[rank 1] ``); ``T`` is the worker's
  wall clock (``time.time()``) when step N completed;
* *recovery* after an event at wall time ``t0`` (SIGKILL, SIGTERM, a new
  node's start) is ``max over the given nodes of (first step line with
  t > t0 and world == W) - t0``: the moment the re-formed group of size W
  has completed a step on every node that must be in it. All processes run
  on one machine, so the event's and the steps' wall clocks are the same clock;
* a *restored line* is ``examples/train_stateful.py``'s ``restored step=N
  from=... round=R [in place] t=T`` (``--print-time``): ``T`` is the worker's
  wall clock once it holds the state again and goes on training;
* *resumed* after ``t0`` is ``max over the given nodes of (first restored
  line with t > t0) - t0``: the moment every node is training again, before
  its first step at the new size completes (the state API's scripts only:
  the others print no timed line there).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence

_STEP = re.compile(
    r"step=(?P<step>\d+) loss=\S+ world=(?P<world>\d+) rank=(?P<rank>\d+) sps=\S+ t=(?P<t>[\d.]+)"
)
_RESUMED = re.compile(r"resumed from step=(?P<step>\d+)")
_RESTORED_AT = re.compile(r"restored step=\d+ from=.* t=(?P<t>[\d.]+)$")


@dataclasses.dataclass(frozen=True)
class StepLine:
    step: int
    world: int
    rank: int
    t: float


def parse_step(line: str) -> StepLine | None:
    """The step line in ``line`` (any prefix allowed), or None."""
    m = _STEP.search(line)
    if m is None:
        return None
    return StepLine(int(m["step"]), int(m["world"]), int(m["rank"]), float(m["t"]))


def parse_steps(lines: Iterable[str]) -> list[StepLine]:
    return [s for s in (parse_step(line) for line in lines) if s is not None]


def resumed_steps(lines: Iterable[str]) -> list[int]:
    """Every ``resumed from step=N`` the workers printed, in order."""
    return [int(m["step"]) for m in (_RESUMED.search(line) for line in lines) if m is not None]


def restored_at(lines: Iterable[str]) -> list[float]:
    """The wall times of every timed ``restored step=...`` line, in order."""
    found = (_RESTORED_AT.search(line.rstrip()) for line in lines)
    return [float(m["t"]) for m in found if m is not None]


def resumed_seconds(nodes: Sequence[Iterable[str]], event_t: float) -> float | None:
    """Seconds from ``event_t`` until every node printed a timed ``restored`` line.

    ``nodes[i]`` is node i's output lines. None if some node printed none after
    ``event_t`` (it did not resume, or its script prints no such line).
    """
    firsts = [min((t for t in restored_at(lines) if t > event_t), default=None) for lines in nodes]
    if not firsts or any(f is None for f in firsts):
        return None
    return max(f for f in firsts if f is not None) - event_t


def first_step_at(steps: Sequence[StepLine], after: float, world: int) -> StepLine | None:
    """The first step completed after wall time ``after`` by a group of size ``world``."""
    later = [s for s in steps if s.t > after and s.world == world]
    return min(later, key=lambda s: s.t) if later else None


def group_resumed_at(nodes: Sequence[Sequence[StepLine]], after: float, world: int) -> float | None:
    """Wall time when every node has completed a step in a group of size ``world``.

    None if some node never did (the group did not re-form in the run).
    """
    firsts = [first_step_at(steps, after, world) for steps in nodes]
    if not firsts or any(f is None for f in firsts):
        return None
    return max(f.t for f in firsts if f is not None)


def recovery_seconds(
    nodes: Sequence[Sequence[StepLine]], event_t: float, world: int
) -> float | None:
    """Seconds from ``event_t`` until every node trains in a group of ``world``."""
    done = group_resumed_at(nodes, event_t, world)
    return None if done is None else done - event_t


def last_step_before(nodes: Sequence[Sequence[StepLine]], t: float) -> int:
    """The highest step any node completed at or before wall time ``t`` (0 if none)."""
    return max((s.step for steps in nodes for s in steps if s.t <= t), default=0)


def steps_lost(last_done: int, resumed_from: int) -> int:
    """Completed steps that must be redone: the work between the checkpoint and the last step."""
    return max(0, last_done - resumed_from)


def ranks_of(steps: Sequence[StepLine], world: int) -> set[int]:
    """The worker ranks a node ran in groups of size ``world``."""
    return {s.rank for s in steps if s.world == world}


def pick_victim(ranks: Sequence[int | None], protected: Iterable[int] = ()) -> int:
    """Index of the node to kill: the highest worker rank, never rank 0 or a protected node.

    ``ranks[i]`` is node i's current worker rank (None if unknown). Rank 0
    hosts the workers' MASTER store and (under torchrun) ``protected`` nodes
    host the rendezvous store; killing either is a different, harsher
    scenario, so the comparison kills an ordinary member.
    """
    skip = set(protected)
    candidates = [(r, i) for i, r in enumerate(ranks) if r is not None and r != 0 and i not in skip]
    if not candidates:
        raise ValueError(f"no node to kill among ranks {list(ranks)} (protected {sorted(skip)})")
    return max(candidates)[1]


# A torchflex join's milestones, in the order they happen, as the agents and
# the example log them: (name, pattern, whose line counts). "newcomer": the
# joining node's first such line; "last": the latest such line of any node
# (the group waits for its slowest member).
JOIN_MILESTONES: tuple[tuple[str, re.Pattern[str], str], ...] = (
    ("zygote_ready", re.compile(r"worker fork server ready"), "newcomer"),
    ("joining", re.compile(r"joining the rendezvous"), "newcomer"),
    ("survivors_stopped", re.compile(r"stopping at step="), "last"),
    ("rounds_over", re.compile(r"re-forming"), "last"),
    ("round_formed", re.compile(r"rendezvous took"), "last"),
    ("workers_started", re.compile(r"(started|kept) workers"), "last"),
    ("workers_resumed", re.compile(r"resumed from step="), "last"),
)


def join_phases(
    nodes: Sequence[Sequence[tuple[float, str]]], newcomer: int, t0: float, until: float
) -> dict[str, float | None]:
    """Seconds from ``t0`` (the new node's start) to each milestone of its join.

    ``nodes[i]`` is node i's (wall time, line) output; ``newcomer`` indexes
    the joining node; only lines in ``[t0, until]`` count. A milestone no
    node logged in the window is None (torchrun logs none of them). Line
    times are when the benchmark read the line, so they lag the event by
    the pipe's delivery (well under a millisecond when the machine is idle).
    """
    out: dict[str, float | None] = {}
    for name, pattern, whose in JOIN_MILESTONES:
        pool = [nodes[newcomer]] if whose == "newcomer" else nodes
        times = [
            t for lines in pool for t, line in lines if t0 <= t <= until and pattern.search(line)
        ]
        if not times:
            out[name] = None
        else:
            out[name] = (min(times) if whose == "newcomer" else max(times)) - t0
    return out
