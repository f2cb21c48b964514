"""When a running job counts as hung, and which rank stopped it (pure).

Where it sits: ``loop.stalls.StallWatch`` feeds ``StallClock`` what it
observed (the job-wide activity counter every member adds to while its
workers make progress, read on this node's clock) and asks ``stalled``;
``loop.supervise`` asks ``culprit`` and ``ordered`` to assemble the
``StallReport`` once a hang is declared. Nothing here reads a clock, a file
or the store.

The rule (docs/failure-model.md, "A rank that stops taking part"): under
synchronous data parallelism one rank that stops taking part stalls every
rank within a step, so the job is hung when *no* member saw progress (a
step, a forward, a report, or a declared pause) for the hang timeout. Each
member judges on its own monotonic clock from when the shared counter last
moved, never comparing clocks across nodes. The timeout is the job's
``hangTimeoutSeconds`` when set (0: off); otherwise it is derived from the
job's own step time (``derived_timeout``). Before the counter first moved in
a round (imports, data loading, the first step's compilation) the bound is
at least ``STARTUP_S``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from torchflex_contract.progress import MAX_STALL_RANKS, MAX_STALL_STACK, RankStall

STARTUP_S = 1800.0
"""The least bound before a round's first progress (imports, data loading, compiling):
gloo's own collective timeout, so a slow start is never called a hang sooner than torch
would fail it."""
DERIVED_MAX_S = 600.0
"""The derived timeout's ceiling, and the timeout until step times are known."""
MIN_DERIVED_S = 60.0
"""The derived timeout's floor: a fast job's scheduler hiccup is not a hang."""
STEP_FACTOR = 10.0
"""A derived timeout is this many typical steps."""
MIN_STEPS_TO_DERIVE = 3
"""Steps a worker must have made (after its first) before its step time is trusted."""
# Frames of a main thread waiting on its peers (in a collective, or in backward, where
# DDP's all-reduce runs): such a rank is a victim of the hang, not its cause.
_WAITING_PATHS = (
    "/torch/distributed/",
    "/torch/autograd/",
    "/torch/nn/parallel/",
    "/torch/_tensor.py",
)


def derived_timeout(step_s: float | None) -> float:
    """The timeout for a job that set none: ``STEP_FACTOR`` steps, within bounds."""
    if step_s is None or step_s <= 0:
        return DERIVED_MAX_S
    return min(DERIVED_MAX_S, max(MIN_DERIVED_S, STEP_FACTOR * step_s))


def timeout(explicit: float | None, step_s: float | None) -> float | None:
    """The hang timeout in force: None when detection is off (``explicit`` 0)."""
    if explicit is None:
        return derived_timeout(step_s)
    return None if explicit <= 0 else explicit


def check_every(limit: float | None) -> float:
    """Seconds between two looks at the activity counter: a tenth of the timeout."""
    if limit is None:
        return 5.0
    return min(5.0, max(0.5, limit / 10.0))


def step_seconds(first_step: float, last_step: float, steps: int) -> float | None:
    """A worker's mean step time from its pulse: between its first and latest step ends
    (so its start-up and first step's compilation are left out)."""
    if steps - 1 < MIN_STEPS_TO_DERIVE or last_step <= first_step:
        return None
    return (last_step - first_step) / (steps - 1)


@dataclasses.dataclass(frozen=True)
class StallClock:
    """What a member knows of the job's progress, on its own monotonic clock."""

    changed_at: float
    """When the counter last moved (or the round started, or we last resumed watching)."""
    checked_at: float
    counter: int | None = None
    moved: bool = False
    """The counter moved at least once in this round: the job made progress."""

    @classmethod
    def start(cls, now: float) -> StallClock:
        return cls(changed_at=now, checked_at=now)

    def observe(self, now: float, counter: int | None, limit: float | None) -> StallClock:
        """The clock after reading ``counter`` at ``now``.

        A gap since the previous look longer than half the timeout (this agent
        was frozen or starved) restarts the wait: we were not watching, so we
        cannot say nothing happened.
        """
        gap_limit = (limit if limit is not None else DERIVED_MAX_S) / 2.0
        if now - self.checked_at > gap_limit:
            return dataclasses.replace(self, changed_at=now, checked_at=now, counter=counter)
        if counter is not None and counter != self.counter:
            moved = self.moved or self.counter is not None or counter > 0
            return StallClock(changed_at=now, checked_at=now, counter=counter, moved=moved)
        return dataclasses.replace(self, checked_at=now)

    def idle(self, now: float) -> float:
        return now - self.changed_at

    def stalled(self, now: float, limit: float | None) -> bool:
        """Whether nobody made progress for the timeout (``STARTUP_S`` before any)."""
        if limit is None:
            return False
        bound = limit if self.moved else max(limit, STARTUP_S)
        return self.idle(now) >= bound


def main_thread(dump: str) -> str:
    """The main thread's part of a faulthandler dump (the thread running the script);
    the whole dump when no thread block shows the script's module frame."""
    blocks: list[list[str]] = []
    for line in dump.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            blocks.append([line])
        elif blocks:
            blocks[-1].append(line)
    for block in blocks:
        if any("<module>" in line or "runpy" in line for line in block):
            return "\n".join(block)
    return dump


def waiting_on_peers(stack: str) -> bool:
    """Whether a main thread's innermost frame is inside torch's collectives or autograd."""
    for line in stack.splitlines():
        if line.strip().startswith("File "):
            return any(path in line for path in _WAITING_PATHS)
    return False


def bounded_stack(stack: str) -> str:
    """The innermost ``MAX_STALL_STACK`` characters of a main thread (its head)."""
    return stack[:MAX_STALL_STACK]


def culprit(entries: Sequence[RankStall]) -> RankStall | None:
    """The rank that stopped taking part: not waiting on its peers, then the fewest
    steps, then the longest idle. None when nobody reported."""
    if not entries:
        return None
    pool = [e for e in entries if not e.waiting] or list(entries)
    return min(pool, key=lambda e: (e.steps, -e.idle, e.rank))


def ordered(entries: Sequence[RankStall], first: RankStall | None) -> tuple[RankStall, ...]:
    """The culprit first, then the others by rank; at most ``MAX_STALL_RANKS``."""
    rest = sorted((e for e in entries if e is not first), key=lambda e: e.rank)
    return tuple(([first] if first is not None else []) + rest)[:MAX_STALL_RANKS]
