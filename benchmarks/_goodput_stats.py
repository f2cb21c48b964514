"""The goodput benchmark's accounting: from the workers' step lines to steps and seconds.

Where it sits: ``benchmarks.goodput`` collects the step lines every worker of
every node printed (``examples/train_elastic.py --print-time``, parsed by
``benchmarks._proc_logs``; a killed node's lines stay collected) and hands
them here with the window it measured. Pure: no I/O, no clock; table-tested
in ``tests/unit/benchmarks/test_goodput_stats.py``.

Definitions (the RESULTS.md section repeats them):

* the *job timeline* is one completion per step of the job: every rank of a
  group prints the same step, so a step another rank of the same world
  already printed in the current incarnation is a duplicate; a step at or
  below the previous one that is no such duplicate (a rank printing a step
  again) starts a new incarnation: the group restarted from a checkpoint
  behind it;
* *steps completed*: completions in the window, redone ones included;
* *steps lost*: completions thrown away, i.e. done and then done again after
  a restart from a checkpoint behind them; at each restart that is the step
  before it minus the step resumed from (``prev - (first - 1)``);
* *progress* = completed - lost: how far the job's step counter advanced;
* *ideal* = the no-failure step rate (completions per second at full size,
  measured on the same job just before the chaos window) x the window;
  *goodput* = progress / ideal;
* *time at full size* / *at reduced size*: the window's seconds in which the
  job completed steps at its full world size / at a smaller one (each gap
  between completions counts for the group of the later one); *stalled*: the
  seconds in gaps longer than ``stall_gap`` (no step at all: a group
  re-forming, a survivor hung on a frozen peer); the three add up to the window.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from benchmarks._proc_logs import StepLine


def job_timeline(steps: Iterable[StepLine]) -> list[StepLine]:
    """One line per completed step of the job, in time order (see the module's definition)."""
    out: list[StepLine] = []
    printed: dict[int, tuple[int, set[int]]] = {}  # this incarnation: step -> (world, ranks)
    prev: int | None = None
    for line in sorted(steps, key=lambda s: (s.t, s.step)):
        world, ranks = printed.get(line.step, (line.world, set()))
        if ranks and world == line.world and line.rank not in ranks:
            ranks.add(line.rank)  # the same step of the same group, from another rank
            continue
        if prev is not None and line.step <= prev:
            printed = {}  # a rank printed this step again: a restart, a new incarnation
        printed[line.step] = (line.world, {line.rank})
        out.append(line)
        prev = line.step
    return out


def step_rate(timeline: Sequence[StepLine], start: float, end: float, world: int) -> float:
    """Completions per second at ``world`` in ``(start, end]``; 0.0 for an empty window."""
    if end <= start:
        return 0.0
    return sum(1 for s in timeline if start < s.t <= end and s.world == world) / (end - start)


@dataclasses.dataclass(frozen=True)
class Goodput:
    """One launcher's chaos window, accounted."""

    completed: int
    lost: int
    ideal: float
    full_s: float
    reduced_s: float
    stalled_s: float
    restarts: int

    @property
    def progress(self) -> int:
        return self.completed - self.lost

    @property
    def goodput(self) -> float | None:
        """progress / ideal; None without an ideal rate (the baseline never trained)."""
        return self.progress / self.ideal if self.ideal > 0 else None


def _before(timeline: Sequence[StepLine], start: float) -> StepLine | None:
    earlier = [s for s in timeline if s.t <= start]
    return earlier[-1] if earlier else None


def account(
    timeline: Sequence[StepLine],
    start: float,
    end: float,
    *,
    full_world: int,
    ideal_rate: float,
    stall_gap: float,
) -> Goodput:
    """The window ``(start, end]`` of a job timeline (``job_timeline``'s output)."""
    if end <= start or stall_gap <= 0:
        raise ValueError(f"need start < end and stall_gap > 0, got {start}, {end}, {stall_gap}")
    inside = [s for s in timeline if start < s.t <= end]
    last = _before(timeline, start)
    prev = None if last is None else last.step
    lost = restarts = 0
    full = reduced = stalled = 0.0
    t_prev = start
    for s in inside:
        if prev is not None and s.step <= prev:
            lost += prev - (s.step - 1)
            restarts += 1
        prev = s.step
        gap = s.t - t_prev
        if gap > stall_gap:
            stalled += gap
        elif s.world >= full_world:
            full += gap
        else:
            reduced += gap
        t_prev = s.t
    tail = end - t_prev
    world = inside[-1].world if inside else (last.world if last is not None else 0)
    if tail > stall_gap or world == 0:
        stalled += tail
    elif world >= full_world:
        full += tail
    else:
        reduced += tail
    return Goodput(
        completed=len(inside),
        lost=lost,
        ideal=ideal_rate * (end - start),
        full_s=full,
        reduced_s=reduced,
        stalled_s=stalled,
        restarts=restarts,
    )


def progress_curve(
    timeline: Sequence[StepLine], start: float, end: float
) -> list[tuple[float, int]]:
    """(seconds into the window, job step) at each completion in it: the plot's line."""
    return [(s.t - start, s.step) for s in timeline if start < s.t <= end]
