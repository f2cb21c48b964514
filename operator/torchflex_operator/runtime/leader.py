"""Active/standby between operator replicas: the gate our reconcile workers obey.

Where it sits: between ``kube`` (the Lease reads and writes) and the
``runtime.reconcile`` (its workers wait on ``Gate.wait_active``; ``cli`` also hands
``Gate.active`` to ``Kube.may_write``, so even a pass already running sends no
write once the gate is closed). ``Gate`` alone (``--standalone``) is
always open. ``LeaseGate`` runs client-go style leader election on a
``coordination.k8s.io`` Lease: the rules are pure (``planning.lease``); this module
is the loop that reads, writes, keeps time and opens or closes the gate.

kopf itself runs standalone on every replica: its watches only fill our
caches and queue (``handlers``), so a standby has warm caches and writes
nothing; who reconciles is decided here alone.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import random
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from torchflex_operator.model.errors import ConflictError, OperatorError
from torchflex_operator.planning import lease
from torchflex_operator.planning.lease import Action, Observed, Record, Timing
from torchflex_operator.runtime.workqueue import cancel_all

log = logging.getLogger(__name__)
# Said (at info) when a stopping holder could not release its Lease: in helm uninstall's
# window the RBAC is gone before the pod stops (the install tests look for this text).
LEASE_NOT_RELEASED = "lease not released on stop"
# Read/acquire failures of a standby are logged at debug until they last this long.
_QUIET_FAILURES_S = 60.0
_RELEASE_TIMEOUT_S = 5.0


def own_identity() -> str:
    """``$POD_ID`` (the chart sets the pod name), else host/pid/random like kopf's."""
    pod = os.environ.get("POD_ID")
    if pod:
        return pod
    suffix = "".join(random.choices("abcdefghijklmnopqrstuvwxyz0123456789", k=4))
    return f"{os.environ.get('USER', 'operator')}@{socket.gethostname()}/{os.getpid()}/{suffix}"


class Gate:
    """Always active (``--standalone``); the base of ``LeaseGate``."""

    def __init__(self) -> None:
        self._active = asyncio.Event()
        self._active.set()
        self.on_change: Callable[[bool], None] | None = None

    @property
    def active(self) -> bool:
        return self._active.is_set()

    async def wait_active(self) -> None:
        await self._active.wait()

    def _set(self, active: bool, why: str = "", *, warn: bool = False) -> None:
        if active == self._active.is_set():
            return
        if active:
            self._active.set()
        else:
            self._active.clear()
        state = "active" if active else "standby"
        log.log(logging.WARNING if warn else logging.INFO, "operator is now %s%s", state, why)
        if self.on_change is not None:
            self.on_change(active)

    def start(self) -> None:
        """Begin electing (nothing to elect when standalone)."""

    async def stop(self) -> None:
        """Stop electing (and give up what we hold)."""


class LeaseSource(Protocol):
    """The Lease calls of ``kube.Kube``; each raises ``OperatorError`` subclasses."""

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def create_lease(
        self, namespace: str, name: str, spec: Mapping[str, Any]
    ) -> dict[str, Any]: ...

    async def replace_lease(
        self, namespace: str, name: str, resource_version: str, spec: Mapping[str, Any]
    ) -> dict[str, Any]: ...


def _parse(obj: Mapping[str, Any]) -> tuple[Record, str | None]:
    rv = (obj.get("metadata") or {}).get("resourceVersion")
    return Record.from_spec(obj.get("spec")), None if rv is None else str(rv)


class LeaseGate(Gate):
    """Open while this replica holds the Lease and renewed it within the renew deadline."""

    def __init__(
        self,
        source: LeaseSource,
        namespace: str,
        name: str,
        identity: str,
        timing: Timing,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        super().__init__()
        self._active.clear()  # standby until we hold the lease
        self.source = source
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.timing = timing
        self.clock = clock
        self.wall = wall
        self.observed: Observed | None = None
        self.renewed_at: float | None = None
        """Monotonic start of our last successful create/take/renew."""
        self._tasks: list[asyncio.Task[None]] = []
        self._deadline: asyncio.TimerHandle | None = None
        self._failing_since: float | None = None
        self._last_error: OperatorError | None = None
        self._warned_at: float | None = None
        self._reported: str | None = None
        """The holder last logged (client-go's ``OnNewLeader``)."""

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def holder(self) -> str | None:
        """The holder as last observed ("" when free, None when unknown or absent)."""
        if self.observed is None or self.observed.record is None:
            return None
        return self.observed.record.holder

    # -- the gate ---------------------------------------------------------------------

    def evaluate(self) -> None:
        """Open or close the gate from what was last observed; re-run at the renew deadline,
        so it closes on time even while the loop waits on a slow request."""
        now = self.clock()
        active = lease.leading(self.observed, self.renewed_at, self.identity, self.timing, now)
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if active and self.renewed_at is not None:
            left = self.renewed_at + self.timing.renew_deadline_s - now
            self._deadline = asyncio.get_running_loop().call_later(left, self.evaluate)
        holder = self.holder
        if holder is not None and holder not in {self._reported, self.identity}:
            log.info("Lease %s is held by %s", self.ref, holder or "nobody")
        if holder is not None:
            self._reported = holder
        if active:
            self._set(True, f": holds Lease {self.ref} as {self.identity}")
        elif self.active and self.holder == self.identity:
            # Still named in the record, but not renewed in time: others may take it soon.
            cause = f" (last error: {self._last_error})" if self._last_error else ""
            why = f": Lease {self.ref} not renewed within {self.timing.renew_deadline_s:g}s"
            self._set(False, why + cause, warn=True)
        else:
            shown = "nobody" if holder == "" else holder or "not known yet"
            self._set(False, f": Lease {self.ref} is held by {shown}")

    # -- one election step ---------------------------------------------------------------

    async def step(self) -> float:
        """Read when needed, decide, write; returns the seconds until the next step."""
        known = self.observed
        if known is None or known.resource_version is None or self.holder != self.identity:
            await self._read()  # the holder renews from what it wrote (client-go's fast path)
        decision = lease.decide(
            self.observed, self.renewed_at, self.identity, self.timing, self.clock(), self.wall()
        )
        if decision.action is Action.WAIT or decision.write is None:
            return decision.next_in
        started = self.clock()
        try:
            obj = await self._write(decision.action, decision.write)
        except ConflictError:
            # Someone else wrote it since we read it: whatever we held, we hold no more.
            self.observed = None
            self.evaluate()
            return 0.0
        record, rv = _parse(obj)
        self.observed = Observed(record, rv, self.clock())
        self.renewed_at = started
        return decision.next_in

    async def _read(self) -> None:
        obj = await self.source.get_lease(self.namespace, self.name)
        record, rv = (None, None) if obj is None else _parse(obj)
        now = self.clock()
        if self.observed is None:
            self.observed = Observed(record, rv, now)
        else:
            self.observed = self.observed.seen_again(record, rv, now)

    async def _write(self, action: Action, record: Record) -> dict[str, Any]:
        if action is Action.CREATE:
            return await self.source.create_lease(self.namespace, self.name, record.spec())
        assert self.observed is not None and self.observed.resource_version is not None
        rv = self.observed.resource_version
        return await self.source.replace_lease(self.namespace, self.name, rv, record.spec())

    # -- the loop -----------------------------------------------------------------------

    def start(self) -> None:
        log.info("standby until this replica holds Lease %s (as %s)", self.ref, self.identity)
        self._tasks.append(asyncio.create_task(self._run(), name=f"lease {self.ref}"))

    async def _run(self) -> None:
        while True:
            try:
                delay = await self.step()
                self._failing_since = self._last_error = None
            except OperatorError as exc:
                self._failed(exc)
                delay = self.timing.retry_period_s
            self.evaluate()
            if self.holder != self.identity:
                # Candidates spread out (client-go jitters by up to 1.2 x the period).
                delay *= 1 + random.random() * (lease.JITTER - 1)
            await asyncio.sleep(delay)

    def _failed(self, exc: OperatorError) -> None:
        """A failed read or write. The holder's fate is the renew deadline (``evaluate``
        warns when it passes); anyone else says it at debug until it lasts a while."""
        now = self.clock()
        self._last_error = exc
        if self._failing_since is None:
            self._failing_since = now
        log.debug("leader election on Lease %s: %s", self.ref, exc)
        lasted = now - self._failing_since
        if self.holder == self.identity or lasted < _QUIET_FAILURES_S:
            return
        if self._warned_at is not None and now - self._warned_at < 5 * _QUIET_FAILURES_S:
            return
        self._warned_at = now
        log.warning(
            "leader election on Lease %s failing for %.0fs: %s; this replica stands by",
            self.ref,
            lasted,
            exc,
        )

    async def stop(self) -> None:
        """Stop electing; a holder closes its gate, then releases the Lease so a standby
        takes over at its next read instead of after the lease duration."""
        await cancel_all(self._tasks)
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        observed = self.observed
        self._set(False, ": stopping")
        if observed is None or observed.record is None or observed.resource_version is None:
            return
        if observed.record.holder != self.identity:
            return
        spec = lease.released(observed.record, self.wall()).spec()
        try:
            await asyncio.wait_for(
                self.source.replace_lease(
                    self.namespace, self.name, observed.resource_version, spec
                ),
                _RELEASE_TIMEOUT_S,
            )
        except (OperatorError, TimeoutError) as exc:
            log.info(
                "%s: Lease %s (%s); a standby takes it when it expires",
                LEASE_NOT_RELEASED,
                self.ref,
                exc,
            )
        else:
            log.info("released Lease %s", self.ref)
        self.observed = None
