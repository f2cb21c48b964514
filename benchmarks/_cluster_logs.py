"""Pure parsing and arithmetic of the cluster-level recovery benchmark.

Where it sits: ``benchmarks._cluster_job`` reads the container logs the
process kubelet keeps for each pod incarnation (``<ns>_<pod>_<uid>/trainer.log``);
``benchmarks.recovery_cluster`` turns them into numbers with the functions
here. No I/O, no clocks: unit-tested in
``tests/unit/benchmarks/test_recovery_cluster.py``.

Definitions (also written into RESULTS.md by the driver):

* a *step line* is the example's ``step=N loss=X world=W rank=R sps=S t=T``
  (``--print-time``; any launcher prefix allowed), ``T`` being the worker's
  wall clock when step N completed. Pods run as processes on this machine,
  so ``T`` and the benchmark's own ``time.time()`` are the same clock;
* a *new worker* announces itself with ``resumed from step=N`` (the example
  prints it when it loads a checkpoint, before its first step). The
  benchmark only kills once a checkpoint exists, so every worker started
  after the kill prints it;
* the *first step of the re-formed group* on a survivor pod is its first
  step line that follows the first ``resumed`` line written after its last
  step completed at or before the kill. This holds for both launchers
  (torchrun's worker lines carry no rendezvous round) and ignores a step the
  old worker might still finish just after the kill.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Iterable, Mapping, Sequence

from benchmarks._proc_logs import JOIN_MILESTONES, StepLine, parse_step

_RESUMED = re.compile(r"resumed from step=(\d+)")


@dataclasses.dataclass(frozen=True)
class Resumed:
    """A worker started and loaded the checkpoint of ``step``."""

    step: int


Event = StepLine | Resumed


def parse_events(lines: Iterable[str]) -> list[Event]:
    """The step and ``resumed`` lines of one pod incarnation's log, in order."""
    out: list[Event] = []
    for line in lines:
        step = parse_step(line)
        if step is not None:
            out.append(step)
        elif m := _RESUMED.search(line):
            out.append(Resumed(int(m[1])))
    return out


def steps_of(events: Sequence[Event]) -> list[StepLine]:
    return [e for e in events if isinstance(e, StepLine)]


def first_new_group_step(
    events: Sequence[Event], after: float, world: int | None = None
) -> StepLine | None:
    """A survivor's first step in a group formed after wall time ``after``.

    See the module docstring; ``world`` keeps only groups of that size
    (None: any size). An incarnation that started after ``after`` (a
    replacement pod) has no step before it, so its first ``resumed`` counts.
    """
    start = 0
    for i, e in enumerate(events):
        if isinstance(e, StepLine) and e.t <= after:
            start = i + 1
    restarted = False
    for e in events[start:]:
        if isinstance(e, Resumed):
            restarted = True
        elif restarted and (world is None or e.world == world) and e.t > after:
            return e
    return None


def group_formed_at(
    pods: Mapping[str, Sequence[Event]], after: float, world: int | None = None
) -> float | None:
    """Wall time when every pod in ``pods`` trained in a group formed after ``after``.

    None if some pod has not (yet).
    """
    firsts = [first_new_group_step(events, after, world) for events in pods.values()]
    if not firsts or any(f is None for f in firsts):
        return None
    return max(f.t for f in firsts if f is not None)


def first_step_at_world(events: Sequence[Event], after: float, world: int) -> StepLine | None:
    """The first step completed after ``after`` in a group of ``world``."""
    later = [s for s in steps_of(events) if s.t > after and s.world == world]
    return min(later, key=lambda s: s.t) if later else None


def all_at_world(pods: Mapping[str, Sequence[Event]], after: float, world: int) -> float | None:
    """Wall time when every pod completed a step at ``world`` after ``after`` (None: not yet).

    Used for the scale-up join: a group of a size never seen before the
    scale request is necessarily a new one.
    """
    firsts = [first_step_at_world(events, after, world) for events in pods.values()]
    if not firsts or any(f is None for f in firsts):
        return None
    return max(f.t for f in firsts if f is not None)


def training_at(
    pods: Mapping[str, Sequence[Event]], world: int, after: float, min_steps: int
) -> bool:
    """Every pod completed ``min_steps`` steps at ``world`` after ``after``."""
    if not pods:
        return False
    return all(
        sum(1 for s in steps_of(ev) if s.world == world and s.t > after) >= min_steps
        for ev in pods.values()
    )


def current_rank(events: Sequence[Event], world: int) -> int | None:
    """The worker rank of the pod's latest step at ``world`` (None: none yet)."""
    mine = [s for s in steps_of(events) if s.world == world]
    return mine[-1].rank if mine else None


# The agent's log stamp (``logging``'s asctime: this machine's local time, ms).
_AGENT_STAMP = re.compile(r"\[torchflex-agent\] (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")
# The new pod's agent's milestones of a scale-up join, in order (its first
# such line after the request counts): the process-level benchmark's, as
# the new node's own agent logs them.
# A warm spare's agent logs ``STANDBY_WAITING`` once it waits for promotion
# (its fork server is started: its imports end while it waits) and
# ``promoted`` when the operator's annotation reaches it; a new pod logs neither.
STANDBY_WAITING = re.compile(r"standby: warm spare")
JOIN_AGENT_MILESTONES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("promoted", re.compile(r"promoted after")),
    *(
        (name, pattern)
        for name, pattern, _ in JOIN_MILESTONES
        if name in ("zygote_ready", "joining", "round_formed", "workers_started")
    ),
)


def agent_stamp(line: str) -> float | None:
    """Wall time of a ``[torchflex-agent]`` log line (None: not one)."""
    m = _AGENT_STAMP.search(line)
    if m is None:
        return None
    return time.mktime(time.strptime(m[1], "%Y-%m-%d %H:%M:%S")) + int(m[2]) / 1000


def join_phases(
    pod_marks: Mapping[str, float | None], new_pod_lines: Iterable[str], t0: float
) -> dict[str, float | None]:
    """Seconds from the scale request ``t0`` to each milestone of a cluster-level join.

    ``pod_marks``: the new pod's ``created``, ``bound`` and ``running``
    times as the API watch saw them (None: not seen); then its agent's own
    milestones (``JOIN_AGENT_MILESTONES``) from its log stamps, and
    ``zygote_spawned`` (ready minus its ``preloaded in`` time). None: not
    logged after ``t0``. Stamps are milliseconds; the watch's times lag the
    API server by its delivery.
    """
    out: dict[str, float | None] = {}
    for mark in ("created", "bound", "running"):
        at = pod_marks.get(mark)
        out[mark] = None if at is None else at - t0
    out["zygote_spawned"] = None
    stamped = [(t, line) for line in new_pod_lines if (t := agent_stamp(line)) is not None]
    for name, pattern in JOIN_AGENT_MILESTONES:
        hit = next(((t, ln) for t, ln in stamped if t >= t0 and pattern.search(ln)), None)
        out[name] = None if hit is None else hit[0] - t0
        if name == "zygote_ready" and hit is not None:
            pre = re.search(r"preloaded in (\d+(?:\.\d+)?)s", hit[1])
            out["zygote_spawned"] = None if pre is None else hit[0] - float(pre[1]) - t0
    return out


def speedup(reference: float | None, ours: float | None) -> float | None:
    """How many times faster ``ours`` is than ``reference`` (None if either is missing)."""
    if reference is None or ours is None or ours <= 0:
        return None
    return reference / ours
