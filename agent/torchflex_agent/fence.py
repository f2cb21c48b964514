"""Fencing: a member that cannot prove it is still a member stops writing.

Where it sits: the agent's heartbeat thread (``rendezvous.liveness``) renews a
``Lease`` after every store round trip that showed its round is not stale;
the agent loop (``loop.agent``) SIGKILLs its workers when the lease runs out or
the group names it lost; workers (through ``checkpoint``) read the lease
file before they write. The arithmetic and the verdicts are pure functions,
table-tested in ``tests/unit/agent``.

Why a lease is enough: peers declare a member lost when its heartbeat
counter has not moved for ``liveness_timeout`` on *their* monotonic clock,
measured from the moment they saw it move, which is after our increment
reached the store. We renew from the moment *before* we sent that
increment, for ``lease_duration`` < ``liveness_timeout``, so our lease runs
out strictly before any peer can reach its verdict (clock rates agree to
well under a percent; clock values are never compared across nodes).

Why a file: a frozen pod (SIGSTOP of agent and workers, SIGCONT later)
wakes all its processes at the same instant, so the agent cannot be relied
on to kill the workers before they run. The agent writes
``<round> <incarnation> <deadline_ns>`` (CLOCK_MONOTONIC, shared by every
process of the host) to a file named in the workers' env
(``TORCHFLEX_FENCE_FILE``, ``TORCHFLEX_ROUND``); a worker reads it and
compares with its own clock: one small read, no store round trip.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from torchflex_contract import env as tfenv

_MIN_MARGIN_INTERVALS = 2.0
"""The lease is shorter than the liveness timeout by at least two heartbeat intervals..."""
_MIN_MARGIN_FRACTION = 0.25
"""...and by at least a quarter of the timeout (a slow store round trip, a busy node)."""


def lease_duration(heartbeat_interval: float, liveness_timeout: float) -> float:
    """How long one renewal keeps this member's workers allowed to write.

    ``liveness_timeout - margin`` with ``margin = max(2 intervals, timeout / 4)``
    and never below half the timeout (config requires timeout > 2 intervals,
    so renewals still come several times per lease). Defaults 0.2 s / 1.5 s:
    1.1 s, so the member fences itself at least 0.4 s before a peer's verdict.
    """
    margin = max(
        _MIN_MARGIN_INTERVALS * heartbeat_interval, _MIN_MARGIN_FRACTION * liveness_timeout
    )
    return max(liveness_timeout - margin, liveness_timeout / 2)


class Verdict(enum.Enum):
    CURRENT = "current"
    """The lease names this round and has not run out: writing is allowed."""
    UNFENCED = "unfenced"
    """No fence configured (the script runs without torchflex, e.g. under torchrun)."""
    EXPIRED = "expired"
    """The agent could not renew in time (frozen, partitioned, store silent)."""
    REVOKED = "revoked"
    """The agent stopped this round's workers on purpose (declared lost, fenced)."""
    OTHER_ROUND = "other-round"
    """The agent has moved on to another round: this worker's group is over."""
    UNREADABLE = "unreadable"
    """The lease file is missing or malformed while a fence is configured."""

    @property
    def may_write(self) -> bool:
        return self in (Verdict.CURRENT, Verdict.UNFENCED)


@dataclasses.dataclass(frozen=True)
class LeaseState:
    round: int
    incarnation: str
    deadline_ns: int
    """CLOCK_MONOTONIC (``time.monotonic_ns``) deadline; 0 means revoked."""

    def encode(self) -> str:
        return f"{self.round} {self.incarnation or '-'} {self.deadline_ns}\n"

    @classmethod
    def decode(cls, text: str) -> LeaseState:
        parts = text.split()
        if len(parts) != 3:
            raise ValueError(f"malformed lease {text!r}")
        round_no, incarnation, deadline = parts
        return cls(int(round_no), "" if incarnation == "-" else incarnation, int(deadline))


def judge(state: LeaseState | None, my_round: int, now_ns: int) -> Verdict:
    """May a worker of ``my_round`` write now? (Pure; ``state`` None: unreadable.)"""
    if state is None:
        return Verdict.UNREADABLE
    if state.round != my_round:
        return Verdict.OTHER_ROUND
    if state.deadline_ns <= 0:
        return Verdict.REVOKED
    if now_ns >= state.deadline_ns:
        return Verdict.EXPIRED
    return Verdict.CURRENT


@dataclasses.dataclass(frozen=True)
class FenceCheck:
    verdict: Verdict
    round: int = -1
    incarnation: str = ""


def check(environ: Mapping[str, str] | None = None) -> FenceCheck:
    """The worker side: is this process's round still current? (reads one small file)"""
    env = os.environ if environ is None else environ
    path = env.get(tfenv.FENCE_FILE)
    if not path:
        return FenceCheck(Verdict.UNFENCED)
    try:
        my_round = int(env.get(tfenv.ROUND, "-1"))
    except ValueError:
        return FenceCheck(Verdict.UNREADABLE)
    try:
        state: LeaseState | None = LeaseState.decode(Path(path).read_text())
    except (OSError, ValueError):
        state = None
    verdict = judge(state, my_round, time.monotonic_ns())
    return FenceCheck(verdict, my_round, state.incarnation if state is not None else "")


class Lease:
    """The agent side: one lease file, renewed by the heartbeat thread, read by the loop."""

    def __init__(self, path: Path, duration: float) -> None:
        self.path = path
        self.duration = duration
        self._state = LeaseState(-1, "", 0)
        # The heartbeat thread renews while the loop may revoke: a renewal
        # must never resurrect a revoked lease.
        self._lock = threading.Lock()

    def grant(self, round_no: int, incarnation: str, since: float) -> None:
        """Start a round's lease: valid ``duration`` from ``since`` (a ``time.monotonic()``)."""
        with self._lock:
            self._write(LeaseState(round_no, incarnation, int((since + self.duration) * 1e9)))

    def renew(self, since: float) -> None:
        """Extend from ``since``: when the round trip that proved membership began."""
        with self._lock:
            state = self._state
            if state.deadline_ns <= 0:
                return  # revoked stays revoked for this round
            deadline = max(state.deadline_ns, int((since + self.duration) * 1e9))
            self._write(dataclasses.replace(state, deadline_ns=deadline))

    def revoke(self) -> None:
        with self._lock:
            self._write(dataclasses.replace(self._state, deadline_ns=0))

    def expired(self, now: float | None = None) -> bool:
        """True once the current round's lease ran out or was revoked."""
        t = time.monotonic() if now is None else now
        with self._lock:
            deadline = self._state.deadline_ns
        return deadline <= 0 or t * 1e9 >= deadline

    def worker_env(self, round_no: int) -> dict[str, str]:
        return {tfenv.FENCE_FILE: str(self.path), tfenv.ROUND: str(round_no)}

    def _write(self, state: LeaseState) -> None:
        # Rename so a reader never sees half a line; no fsync: only running
        # processes of this host read it, never anything after a reboot.
        self._state = state
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(state.encode())
        os.replace(tmp, self.path)


def reform_grace(
    stop_grace: float, store_lost_grace: float, store_lost: bool, silent: bool
) -> float:
    """Seconds workers get between SIGTERM and SIGKILL when their round ends.

    A member lost *silently* (frozen, partitioned: detected by heartbeat
    timeout) leaves every survivor's workers blocked in a collective that
    only the backend's own timeout ends; a SIGTERM handler cannot run there,
    so a grace would only delay recovery. Their last completed step is in
    the last checkpoint, which is all a grace could have saved.
    """
    if silent:
        return 0.0
    if store_lost:
        return store_lost_grace
    return stop_grace
