"""Active/standby between operator replicas: the gate our reconcile workers obey.

Where it sits: kopf's peering (``--peering``) pauses kopf's own watch
streams while a peer with a higher or the same priority is alive, but knows
nothing of our work queue, its timers and its workers, which would go on
reconciling from a frozen cache. ``PeeringGate`` reads the same peering
object(s) kopf keeps its keep-alives in (one watch each, no polling),
applies kopf's rule (``decide``, pure) and opens or closes the gate the
reconciler's workers wait on. ``Gate`` alone (``--standalone``) is always
open. Who wins among identical replicas is set by the priority (``--priority
oldest``: the longest-running replica, so a new replica never pre-empts a
working one).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import logging
import os
import random
import socket
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from torchflex_operator.errors import OperatorError
from torchflex_operator.timestamps import parse_time
from torchflex_operator.workqueue import cancel_all

log = logging.getLogger(__name__)

_RETRY_S = (0.5, 1.0, 2.0, 5.0, 10.0)


def own_identity() -> str:
    """kopf's rule: ``$POD_ID`` (the pod name in a Deployment), else user@host/pid/random."""
    pod = os.environ.get("POD_ID")
    if pod:
        return pod
    suffix = "".join(random.choices("abcdefghijklmnopqrstuvwxyz0123456789", k=4))
    return f"{os.environ.get('USER', 'operator')}@{socket.gethostname()}/{os.getpid()}/{suffix}"


@dataclasses.dataclass(frozen=True)
class Peer:
    identity: str
    priority: int
    deadline: dt.datetime


def peers_of(status: Mapping[str, Any], now: dt.datetime) -> list[Peer]:
    """Entries of a kopf peering object's ``status`` (identity -> info)."""
    out = []
    for identity, info in status.items():
        if not isinstance(info, Mapping):
            continue
        try:
            priority = int(info.get("priority", 0))
            lifetime = int(info.get("lifetime", 60))
        except (TypeError, ValueError):
            continue
        seen = parse_time(info.get("lastseen")) or now  # kopf: no lastseen = seen now
        out.append(Peer(str(identity), priority, seen + dt.timedelta(seconds=lifetime)))
    return out


def decide(
    status: Mapping[str, Any] | None, identity: str, priority: int, now: dt.datetime
) -> tuple[bool, float | None]:
    """kopf's rule: active unless another live peer has a higher or equal priority.

    Stricter than kopf in one way: a replica whose own keep-alive has expired
    (its peers already count it dead) is standby too. Returns (active, seconds
    until a keep-alive expires and the decision may change without an event).
    No peering object: standby, as kopf (it waits for the object to exist).
    """
    if status is None:
        return False, None
    peers = peers_of(status, now)
    own = next((p for p in peers if p.identity == identity), None)
    if own is not None and own.deadline <= now:
        # Our keep-alive lapsed (API unreachable?): peers already count us dead.
        return False, None
    blocking = [
        p for p in peers if p.identity != identity and p.deadline > now and p.priority >= priority
    ]
    if not blocking:
        return True, None if own is None else (own.deadline - now).total_seconds()
    return False, min((p.deadline - now).total_seconds() for p in blocking)


class Gate:
    """Always active (``--standalone``); the base of ``PeeringGate``."""

    def __init__(self) -> None:
        self._active = asyncio.Event()
        self._active.set()
        self.on_change: Callable[[bool], None] | None = None

    @property
    def active(self) -> bool:
        return self._active.is_set()

    async def wait_active(self) -> None:
        await self._active.wait()

    def _set(self, active: bool) -> None:
        if active == self._active.is_set():
            return
        if active:
            self._active.set()
        else:
            self._active.clear()
        log.info("operator is now %s", "active" if active else "standby (a peer is active)")
        if self.on_change is not None:
            self.on_change(active)

    def start(self) -> None:
        """Begin observing (nothing to observe when standalone)."""

    async def stop(self) -> None:
        """Stop observing."""


class PeeringSource(Protocol):
    async def watch_peering(
        self, namespace: str | None, name: str, seen: Callable[[Mapping[str, Any] | None], None]
    ) -> None:
        """One list-then-watch cycle of the peering object; ``seen`` gets each state
        (None: absent). Returns when the watch ends; raises ``OperatorError``."""


class PeeringGate(Gate):
    """Open while kopf's rule says this replica is the active one, in every peering object.

    ``namespaces`` None means the cluster-wide ``ClusterKopfPeering``; else
    one ``KopfPeering`` per namespace (kopf pauses if any of them says so).
    """

    def __init__(  # noqa: PLR0917 - one call site, all required
        self,
        source: PeeringSource,
        name: str,
        namespaces: list[str] | None,
        identity: str,
        priority: int,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        super().__init__()
        self._active.clear()  # standby until the peering object has been read
        self.source = source
        self.name = name
        self.scopes: list[str | None] = list(namespaces) if namespaces is not None else [None]
        self.identity = identity
        self.priority = priority
        self.clock = clock
        self._status: dict[str | None, Mapping[str, Any] | None] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._wake = asyncio.Event()

    def evaluate(self) -> float | None:
        """Recompute the gate from what was last seen; seconds until it may change."""
        now = self.clock()
        active = len(self._status) == len(self.scopes)
        recheck: list[float] = []
        for scope in self.scopes:
            ok, left = decide(self._status.get(scope), self.identity, self.priority, now)
            active = active and ok
            if left is not None:
                recheck.append(left)
        self._set(active)
        return min(recheck) if recheck else None

    def seen(self, scope: str | None, obj: Mapping[str, Any] | None) -> None:
        self._status[scope] = None if obj is None else dict(obj.get("status") or {})
        self._wake.set()

    def start(self) -> None:
        for scope in self.scopes:
            self._tasks.append(asyncio.create_task(self._observe(scope), name=f"peering {scope}"))
        self._tasks.append(asyncio.create_task(self._timer(), name="peering timer"))

    async def stop(self) -> None:
        await cancel_all(self._tasks)

    async def _timer(self) -> None:
        """Re-decide on every observation, and when a blocking peer's keep-alive expires."""
        while True:
            left = self.evaluate()
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                # A small margin past the deadline: kopf decides at the same instant.
                timeout = None if left is None else max(0.05, left + 0.05)
                await asyncio.wait_for(self._wake.wait(), timeout)

    async def _observe(self, scope: str | None) -> None:
        failures = 0
        while True:
            try:
                await self.source.watch_peering(scope, self.name, lambda o: self.seen(scope, o))
                failures = 0
            except OperatorError as exc:
                delay = _RETRY_S[min(failures, len(_RETRY_S) - 1)]
                failures += 1
                log.warning(
                    "watching peering %s in %s: %s; retry in %.1fs", self.name, scope, exc, delay
                )
                await asyncio.sleep(delay)
