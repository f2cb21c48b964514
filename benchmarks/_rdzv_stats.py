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

With ``roles`` (Independent roles, as a multi-role job's agents run them) the
members form one group per role, each under its own key id, all at once: the
trial counts if every role formed its group (``evaluate_roles``), and its
latency is still from the last join of any role to the last rank of any.
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
    role: int = 0

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
            role=int(raw.get("role", 0)),
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


def role_of(index: int, roles: int) -> int:
    """The role of the ``index``-th member of a trial: members alternate over the roles."""
    return index % roles


def role_key_id(run_id: str, role: int, roles: int) -> str:
    """The key id role ``role`` uses: the agent's ``<rdzv-id>.<role>``, or ``run_id`` alone."""
    return run_id if roles == 1 else f"{run_id}.role{role}"


def evaluate_roles(n: int, roles: int, members: Sequence[MemberResult]) -> TrialOutcome:
    """``n`` members over ``roles`` Independent roles: each role one group of ``n / roles``."""
    if roles == 1:
        return evaluate(n, members)
    if n % roles:
        raise ValueError(f"{n} members do not split evenly over {roles} roles")
    for role in range(roles):
        mine = [m for m in members if m.role == role]
        out = evaluate(n // roles, mine)
        if out.problem is not None:
            return TrialOutcome(n, None, out.join_spread, f"role {role}: {out.problem}")
    starts = [m.start for m in members]
    if len(members) != n:
        return TrialOutcome(n, None, max(starts) - min(starts), f"{len(members)} of {n} reported")
    latency = max(m.done for m in members) - max(starts)
    return TrialOutcome(n, latency, max(starts) - min(starts), None)


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
