"""Liveness of a running round: heartbeats, ring watching, the stale-key watch.

Where it sits: the agent starts one ``RoundMonitor`` per round it is a member
of, after ``Rendezvous.next_round`` returned. Two daemon threads, each with
its own store connection (a blocked TCPStore client would stall the other):

* the heartbeat thread increments ``hb/<my rank>`` every interval and reads
  ``hb/<successor>``; if the successor's counter stops advancing for the
  liveness timeout *on this node's monotonic clock* it marks the round stale
  (MemberLost). Clocks of different nodes are never compared, so a skewed or
  busy node is not evicted for its clock.
* the stale thread blocks on ``wait([stale])``: when anyone marks the round
  stale, every member learns it within one store round trip.
* the presence thread (when the successor published a ``watch_port``) holds
  a TCP connection to the successor's ``PresenceServer``. A process that
  dies, even by SIGKILL, has its sockets closed by the kernel, so the
  watcher reads EOF within a network round trip and marks the round stale
  (MemberLost) at once; the heartbeat timeout remains the fallback for a
  node that vanishes without closing anything (power loss, partition).

They report through ``RoundEvent``; store errors report ``StoreLost``.

The heartbeat thread also renews this member's ``fence.Lease`` after each
round trip (increment, then read ``stale``) that shows nobody declared this
member lost; once the round is stale it stops judging its successor (the
round is over: a peer that stopped heartbeating has simply moved on).
A detector records whom it declared lost, and how (``silent``: heartbeat
timeout; ``exited``: presence link closed), in the round's ``lost`` key
before it marks the round stale, so every member can name the lost pods
(``AgentReport.lost_pods``) and a member named there knows to fence itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import selectors
import socket
import threading
import time
import uuid
from collections.abc import Callable

from torchflex_agent.errors import RendezvousError, StoreUnavailableError
from torchflex_agent.fence import Lease
from torchflex_agent.kvstore import KVStore
from torchflex_agent.rdzv_logic import ProgressTracker, RendezvousResult, StaleMark
from torchflex_agent.rendezvous import Rendezvous
from torchflex_contract.progress import RestartReason
from torchflex_contract.store_keys import (
    FINISHED,
    HEARTBEAT,
    INCARNATION,
    LOST,
    STALE,
    Keys,
    round_key,
)

log = logging.getLogger(__name__)

_STALE_WAIT_SLICE = 1.0
_PRESENCE_CONNECT_TIMEOUT = 2.0
_PRESENCE_POLL = 0.5
_STOP_JOIN = 0.3
_LOST_CAS_ATTEMPTS = 16

SILENT = "silent"
"""Lost by heartbeat timeout: frozen, partitioned, powered off."""
EXITED = "exited"
"""Lost by its presence link closing: the agent's process is gone."""


def decode_lost(raw: bytes | None) -> tuple[tuple[int, str], ...]:
    """The round's ``lost`` key as ((rank, how), ...); malformed entries are skipped."""
    if not raw:
        return ()
    try:
        data = json.loads(raw)
    except ValueError:
        return ()
    out = []
    for item in data if isinstance(data, list) else []:
        if isinstance(item, dict) and isinstance(item.get("rank"), int):
            out.append((int(item["rank"]), str(item.get("how", ""))))
    return tuple(out)


def encode_lost(entries: tuple[tuple[int, str], ...]) -> bytes:
    return json.dumps([{"rank": r, "how": how} for r, how in entries]).encode()


def record_lost(store: KVStore, keys: Keys, round_no: int, rank: int, how: str) -> None:
    """Add ``rank`` to the round's lost list (compare-and-set, bounded retries)."""
    key = round_key(keys, round_no, LOST)
    raw = store.get(key)
    for _ in range(_LOST_CAS_ATTEMPTS):
        entries = decode_lost(raw)
        if any(r == rank for r, _how in entries):
            return
        desired = encode_lost((*entries, (rank, how)))
        now = store.compare_set(key, raw, desired)
        if now == desired:
            return
        raw = now
    log.warning("round %d: could not record node rank %d as lost (contention)", round_no, rank)


def read_lost(store: KVStore, keys: Keys, round_no: int) -> tuple[tuple[int, str], ...]:
    return decode_lost(store.get(round_key(keys, round_no, LOST)))


def store_incarnation(store: KVStore, keys: Keys) -> str:
    """The store's incarnation id (written by the first agent to ask; see store_keys)."""
    mine = uuid.uuid4().hex[:12].encode()
    value = store.compare_set(keys.key(INCARNATION), None, mine)
    return (value or mine).decode(errors="replace")


class PresenceServer:
    """Accepts the ring predecessor's presence connections and holds them for the agent's life.

    It never sends anything: the only message is the kernel closing the
    connections when this process exits.
    """

    def __init__(self, host: str = "") -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self._sock.listen(64)
        self._sock.setblocking(False)
        self.port = int(self._sock.getsockname()[1])
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._sock, selectors.EVENT_READ)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="presence")
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._sel.select(_PRESENCE_POLL):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self._sock:
                    with contextlib.suppress(OSError):
                        conn, _addr = self._sock.accept()
                        conn.setblocking(False)
                        self._sel.register(conn, selectors.EVENT_READ)
                    continue
                try:
                    data = sock.recv(64)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:  # the watcher closed its end (its round is over)
                    self._sel.unregister(sock)
                    sock.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(_PRESENCE_POLL + 1.0)
        for key in list(self._sel.get_map().values()):
            with contextlib.suppress(OSError):
                key.fileobj.close()  # type: ignore[union-attr]
        self._sel.close()


@dataclasses.dataclass(frozen=True)
class RoundEvent:
    reason: RestartReason
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class LivenessSettings:
    heartbeat_interval: float
    timeout: float


class RoundMonitor:
    """Watches one closed round until stopped or until the round ends."""

    def __init__(
        self,
        rdzv: Rendezvous,
        result: RendezvousResult,
        settings: LivenessSettings,
        wake: threading.Event,
        *,
        clock: Callable[[], float] = time.monotonic,
        lease: Lease | None = None,
    ) -> None:
        self._rdzv = rdzv
        self._result = result
        self._settings = settings
        self._wake = wake
        self._clock = clock
        self._lease = lease
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._event: RoundEvent | None = None
        self._threads: list[threading.Thread] = []
        self._conn: socket.socket | None = None

    @property
    def event(self) -> RoundEvent | None:
        with self._lock:
            return self._event

    def _report(self, event: RoundEvent) -> None:
        with self._lock:
            if self._event is None:
                self._event = event
        self._wake.set()

    def start(self) -> None:
        # Connections are opened here, on the caller's thread, so a dead
        # store surfaces as an exception to the agent loop, not a silent thread.
        if self._lease is not None:
            since = self._clock()
            incarnation = store_incarnation(self._rdzv.store, self._rdzv.keys)
            self._lease.grant(self._result.round, incarnation, since)
        hb_store = self._rdzv.store.clone()
        stale_store = self._rdzv.store.clone()
        self._threads = [
            threading.Thread(target=self._heartbeat, args=(hb_store,), daemon=True, name="hb"),
            threading.Thread(
                target=self._watch_stale, args=(stale_store,), daemon=True, name="stale"
            ),
        ]
        succ = self._result.successor
        if succ is not None and self._result.nodes[succ].watch_port > 0:
            presence_store = self._rdzv.store.clone()
            self._threads.append(
                threading.Thread(
                    target=self._watch_presence, args=(presence_store,), daemon=True, name="pres"
                )
            )
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        """Stop watching; returns within a fraction of a second (re-forming waits on it).

        A thread still blocked in a store wait finishes on its own, on its
        own connection; whatever it reports concerns a round that is over.
        """
        self._stop.set()
        with self._lock:
            conn = self._conn
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + _STOP_JOIN
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))

    def _key(self, *parts: object) -> str:
        return round_key(self._rdzv.keys, self._result.round, *parts)

    def _heartbeat(self, store: KVStore) -> None:
        me = self._result.node_rank
        succ = self._result.successor
        tracker = ProgressTracker(self._settings.timeout)
        stale = False
        try:
            while not self._stop.is_set():
                since = self._clock()
                store.add(self._key(HEARTBEAT, me), 1)
                stale = stale or store.get(self._key(STALE)) is not None
                declared = stale and me in {
                    r for r, _ in read_lost(store, self._rdzv.keys, self._result.round)
                }
                if self._lease is not None and not declared:
                    # Not declared lost: our workers may go on (and checkpoint
                    # while they stop, when the round ended for another reason).
                    self._lease.renew(since)
                if succ is not None and not stale:
                    raw = store.get(self._key(HEARTBEAT, succ))
                    value = int(raw) if raw is not None else None
                    if tracker.observe(value, self._clock()) and (
                        store.get(self._key(FINISHED, succ)) is None
                    ):
                        self._mark_lost(
                            store, succ, f"node rank {succ} stopped heartbeating", SILENT
                        )
                self._stop.wait(self._settings.heartbeat_interval)
        except StoreUnavailableError as exc:
            self._report(RoundEvent(RestartReason.STORE_LOST, str(exc)))
        finally:
            store.close()

    def _mark_lost(self, store: KVStore, succ: int, detail: str, how: str) -> None:
        if store.get(self._key(FINISHED, succ)) is not None:
            return  # it finished and exited: not a loss
        if store.get(self._key(STALE)) is not None:
            return  # the round is over already: the peer may just have moved on
        record_lost(store, self._rdzv.keys, self._result.round, succ, how)
        mark = StaleMark(RestartReason.MEMBER_LOST, self._rdzv.node.node_id, detail).encode()
        if store.compare_set(self._key(STALE), None, mark) == mark:
            log.warning("round %d: %s", self._result.round, detail)

    def _watch_presence(self, store: KVStore) -> None:
        succ = self._result.successor
        assert succ is not None
        peer = self._result.nodes[succ]
        conn: socket.socket | None = None
        try:
            try:
                conn = socket.create_connection(
                    (peer.addr, peer.watch_port), timeout=_PRESENCE_CONNECT_TIMEOUT
                )
            except OSError as exc:
                # Unreachable is not proof of death (a network policy may
                # drop it): leave the verdict to the heartbeat.
                log.info("round %d: no presence link to node rank %d: %s",
                         self._result.round, succ, exc)  # fmt: skip
                return
            conn.settimeout(_PRESENCE_POLL)
            with self._lock:
                self._conn = conn
            while not self._stop.is_set():
                try:
                    data = conn.recv(64)
                except TimeoutError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    if not self._stop.is_set():
                        self._mark_lost(
                            store,
                            succ,
                            f"node rank {succ}'s agent exited (presence link closed)",
                            EXITED,
                        )
                    return
        except StoreUnavailableError as exc:
            self._report(RoundEvent(RestartReason.STORE_LOST, str(exc)))
        finally:
            if conn is not None:
                conn.close()
            store.close()

    def _watch_stale(self, store: KVStore) -> None:
        try:
            while not self._stop.is_set():
                if store.wait([self._key(STALE)], max(_STALE_WAIT_SLICE, store.wait_slice)):
                    raw = store.get(self._key(STALE))
                    if raw is None:
                        continue
                    mark = StaleMark.decode(raw)
                    self._report(RoundEvent(mark.reason, mark.detail))
                    return
        except StoreUnavailableError as exc:
            self._report(RoundEvent(RestartReason.STORE_LOST, str(exc)))
        except RendezvousError as exc:
            self._report(RoundEvent(RestartReason.STORE_LOST, f"unreadable stale mark: {exc}"))
        finally:
            store.close()


def probe_peers(
    rdzv: Rendezvous, result: RendezvousResult, window: float, settings: LivenessSettings
) -> StaleMark | None:
    """After a local worker failure: is a peer gone (so the failure is collateral)?

    Gloo reports a dead peer's connection reset within milliseconds, long
    before the heartbeat timeout. So sample every member's heartbeat, wait
    up to ``window`` for the round to go stale on its own, then sample
    again: a member whose counter did not move over several heartbeat
    intervals is taken as lost and the round is marked stale for it.
    Returns the round's stale mark if it has one at the end, else None.
    """
    store = rdzv.store
    peers = [i for i in range(result.num_nodes) if i != result.node_rank]

    def sample() -> dict[int, bytes | None]:
        return {i: store.get(round_key(rdzv.keys, result.round, HEARTBEAT, i)) for i in peers}

    before = sample()
    stale_key = round_key(rdzv.keys, result.round, STALE)
    window = max(window, 2.5 * settings.heartbeat_interval)
    if store.wait([stale_key], window):
        return rdzv.stale_mark(result.round)
    after = sample()
    for i in peers:
        if after[i] == before[i] and (
            store.get(round_key(rdzv.keys, result.round, FINISHED, i)) is None
        ):
            if rdzv.stale_mark(result.round) is None:
                record_lost(store, rdzv.keys, result.round, i, SILENT)
            return rdzv.mark_stale(
                result.round,
                RestartReason.MEMBER_LOST,
                f"node rank {i} stopped heartbeating (seen after a worker failure)",
            )
    return rdzv.stale_mark(result.round)
