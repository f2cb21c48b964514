"""Leader election over a ``coordination.k8s.io`` Lease: the pure rules.

Where it sits: ``leader.LeaseGate`` (the thin loop) reads and writes the
Lease through ``kube`` and asks ``decide`` what to do next and ``leading``
whether its reconcile gate may be open; nothing here does I/O or reads a
clock. The semantics are client-go's ``leaderelection`` with a Lease lock:

- The record is the Lease's spec: ``holderIdentity`` (empty: free),
  ``leaseDurationSeconds``, ``acquireTime``, ``renewTime``, ``leaseTransitions``.
- A candidate never compares the record's timestamps with its own clock
  (clocks skew): a lease held by another replica counts as expired once the
  record has not *changed* for ``leaseDurationSeconds`` of the candidate's own
  monotonic clock, measured from when it first saw that version
  (``Observed.changed_at``). So a standby keeps reading it every retry period.
- Every write carries the resourceVersion it was decided from: two candidates
  taking an expired lease at once race on optimistic concurrency, one wins.
- The holder renews every ``retry_period``; it is *leading* only until
  ``renew_deadline`` after the start of its last successful write. Others may
  take over no earlier than ``lease_duration`` after they saw that write,
  which came after its start: a holder that cannot renew closes its gate
  ``lease_duration - renew_deadline`` before anyone else can open theirs.
- A holder that stops releases the lease (empty holder, 1 s duration) so a
  standby takes it at its next read instead of waiting for the expiry.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
from collections.abc import Mapping
from typing import Any

from torchflex_operator.model.timestamps import format_micro_time, parse_time

# client-go's JitterFactor: the renew deadline must leave room for a jittered retry.
JITTER = 1.2


@dataclasses.dataclass(frozen=True)
class Timing:
    lease_duration_s: int
    """How long a record that stopped changing stays valid for the others (whole seconds:
    the Lease's ``leaseDurationSeconds``)."""
    renew_deadline_s: float
    """How long the holder keeps leading after the start of its last successful write."""
    retry_period_s: float
    """How often the holder renews and a standby reads."""

    @classmethod
    def scaled(cls, lease_duration_s: int) -> Timing:
        """client-go's defaults (15 s, 10 s, 2 s) scaled to another lease duration."""
        return cls(lease_duration_s, lease_duration_s * 2 / 3, lease_duration_s * 2 / 15)

    def problems(self) -> list[str]:
        """client-go's constraints; empty when the timing is usable."""
        out = []
        if self.lease_duration_s < 1:
            out.append("the lease duration must be at least 1 s")
        if self.renew_deadline_s >= self.lease_duration_s:
            out.append("the renew deadline must be shorter than the lease duration")
        if self.retry_period_s <= 0:
            out.append("the retry period must be positive")
        elif self.renew_deadline_s <= JITTER * self.retry_period_s:
            out.append(f"the renew deadline must exceed {JITTER} x the retry period")
        return out


@dataclasses.dataclass(frozen=True)
class Record:
    """A Lease's spec as leader election reads and writes it."""

    holder: str
    lease_duration_s: int
    acquire_time: dt.datetime | None
    renew_time: dt.datetime | None
    transitions: int

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | None) -> Record:
        spec = spec or {}
        try:
            duration = int(spec.get("leaseDurationSeconds") or 0)
            transitions = int(spec.get("leaseTransitions") or 0)
        except (TypeError, ValueError):
            duration, transitions = 0, 0
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            lease_duration_s=duration,
            acquire_time=parse_time(spec.get("acquireTime")),
            renew_time=parse_time(spec.get("renewTime")),
            transitions=transitions,
        )

    def spec(self) -> dict[str, Any]:
        """The Lease spec to write (MicroTime stamps, as client-go writes them)."""
        out: dict[str, Any] = {
            "holderIdentity": self.holder or None,
            "leaseDurationSeconds": self.lease_duration_s,
            "leaseTransitions": self.transitions,
        }
        for key, value in (("acquireTime", self.acquire_time), ("renewTime", self.renew_time)):
            out[key] = None if value is None else format_micro_time(value)
        return out


@dataclasses.dataclass(frozen=True)
class Observed:
    """What the loop last read or wrote, and when that version was first seen."""

    record: Record | None
    """None: the Lease does not exist."""
    resource_version: str | None
    changed_at: float
    """Monotonic seconds when this version of the record was first seen (client-go's
    ``observedTime``); a re-read of the same record keeps it."""

    def seen_again(
        self, record: Record | None, resource_version: str | None, now: float
    ) -> Observed:
        """The next read: ``changed_at`` moves only when the record itself changed."""
        if record == self.record:
            return dataclasses.replace(self, resource_version=resource_version)
        return Observed(record, resource_version, now)


class Action(enum.Enum):
    WAIT = "wait"
    """Nothing to write: read again (standby) or renew (holder) after ``Decision.next_in``."""
    CREATE = "create"
    """The Lease does not exist: create it holding it."""
    TAKE = "take"
    """The lease is free or expired: write it holding it, one more transition."""
    RENEW = "renew"
    """We hold it: write a fresh ``renewTime``."""


@dataclasses.dataclass(frozen=True)
class Decision:
    action: Action
    write: Record | None
    """What to write (with ``Observed.resource_version``) for CREATE/TAKE/RENEW."""
    next_in: float
    """Seconds until the loop should decide again."""


def leading(
    observed: Observed | None, renewed_at: float | None, identity: str, timing: Timing, now: float
) -> bool:
    """Whether this replica may reconcile: the record names it and its last successful
    write started less than the renew deadline ago."""
    return (
        observed is not None
        and observed.record is not None
        and observed.record.holder == identity
        and renewed_at is not None
        and now < renewed_at + timing.renew_deadline_s
    )


def expired(observed: Observed, now: float) -> bool:
    """Another holder's lease: unchanged for its own duration on our clock, or free."""
    record = observed.record
    if record is None or not record.holder:
        return True
    return now >= observed.changed_at + record.lease_duration_s


def decide(  # noqa: PLR0917 - the whole state of one election step
    observed: Observed | None,
    renewed_at: float | None,
    identity: str,
    timing: Timing,
    now: float,
    wall: dt.datetime,
) -> Decision:
    """The next step of the election. ``observed`` None: nothing read yet (the loop
    reads first); ``now`` is the monotonic clock, ``wall`` only stamps the record."""
    if observed is None:
        return Decision(Action.WAIT, None, 0.0)
    record = observed.record
    ours = timing.lease_duration_s
    if record is None:
        return Decision(Action.CREATE, Record(identity, ours, wall, wall, 0), timing.retry_period_s)
    if record.holder == identity:
        due = 0.0 if renewed_at is None else renewed_at + timing.retry_period_s - now
        if due > 0:
            return Decision(Action.WAIT, None, due)
        renewed = Record(identity, ours, record.acquire_time or wall, wall, record.transitions)
        return Decision(Action.RENEW, renewed, timing.retry_period_s)
    if not expired(observed, now):
        return Decision(Action.WAIT, None, timing.retry_period_s)
    taken = Record(identity, ours, wall, wall, record.transitions + 1)
    return Decision(Action.TAKE, taken, timing.retry_period_s)


def released(record: Record, wall: dt.datetime) -> Record:
    """What a stopping holder writes: nobody holds it, and it lapses in 1 s for a
    replica that still reads the old rule (client-go's ``ReleaseOnCancel``)."""
    return Record("", 1, wall, wall, record.transitions)
