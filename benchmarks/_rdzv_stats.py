"""Pure arithmetic of the rendezvous benchmark: hosting layout and latency of one trial.

Where it sits: ``benchmarks.rendezvous`` (the driver) and
``benchmarks._rdzv_host`` (the member-hosting processes) share these
definitions so the measurement is defined in one place and unit-tested in
``tests/unit/benchmarks``. No I/O, no clocks.

Definition of one trial's latency (documented in RESULTS.md): every member
records ``start`` (monotonic clock, taken just before it calls the join:
``Rendezvous.next_round`` or ``DynamicRendezvousHandler.next_rendezvous``) and
``done`` (just after the call returned its rank). CLOCK_MONOTONIC is one
clock for every process of the machine, so the stamps compare across the
hosting processes. ``latency = max(done) - max(start)``: from the last join
to the moment every member holds its rank.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class MemberResult:
    start: float
    done: float
    rank: int | None
    world: int | None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> MemberResult:
        return cls(
            start=float(raw["start"]),
            done=float(raw["done"]),
            rank=None if raw.get("rank") is None else int(raw["rank"]),
            world=None if raw.get("world") is None else int(raw["world"]),
            error=raw.get("error"),
        )


@dataclasses.dataclass(frozen=True)
class TrialOutcome:
    """One trial: ``latency`` is None when the trial did not form one valid group."""

    n: int
    latency: float | None
    join_spread: float
    problem: str | None


def split_members(n: int, procs: int) -> list[int]:
    """How many of ``n`` members each hosting process runs (at most ``procs`` processes).

    Balanced: sizes differ by at most one, larger ones first; never an empty host.
    """
    if n < 1 or procs < 1:
        raise ValueError(f"need n >= 1 and procs >= 1, got n={n}, procs={procs}")
    hosts = min(n, procs)
    base, extra = divmod(n, hosts)
    return [base + (1 if i < extra else 0) for i in range(hosts)]


def evaluate(n: int, members: Sequence[MemberResult]) -> TrialOutcome:
    """Check the trial formed one group of ``n`` with ranks 0..n-1, and time it."""
    if not members:
        return TrialOutcome(n, None, 0.0, "no member reported")
    starts = [m.start for m in members]
    spread = max(starts) - min(starts)
    errors = [m.error for m in members if m.error]
    if errors:
        return TrialOutcome(n, None, spread, f"{len(errors)} member(s) failed: {errors[0]}")
    if len(members) != n:
        return TrialOutcome(n, None, spread, f"{len(members)} of {n} members reported")
    ranks = sorted(m.rank for m in members if m.rank is not None)
    if ranks != list(range(n)):
        return TrialOutcome(n, None, spread, "ranks are not a permutation of 0..n-1")
    if any(m.world != n for m in members):
        return TrialOutcome(n, None, spread, "a member saw a world size other than n")
    latency = max(m.done for m in members) - max(starts)
    return TrialOutcome(n, latency, spread, None)
