"""Liveness of a running round: heartbeats, ring watching, the stale-key watch.

Where it sits: the agent starts one ``RoundMonitor`` per round it is a member
of, after ``Rendezvous.next_round`` returned. Daemon threads, each on its
own ``Rendezvous.clone()`` (a store connection of its own: a blocked TCPStore
client would stall the others), through the rendezvous's operations (``beat``,
``heartbeat``, ``record_lost``, ``claim_stale``...), never a store key:

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
``probe_peers`` is the one-shot check a member runs after a local worker failure.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from torchflex_agent.errors import RendezvousError, StoreUnavailableError
from torchflex_agent.fence import Lease
from torchflex_agent.rendezvous.logic import (
    EXITED,
    SILENT,
    ProgressTracker,
    RendezvousResult,
    StaleMark,
)
from torchflex_agent.rendezvous.protocol import Rendezvous
from torchflex_contract.progress import RestartReason

log = logging.getLogger(__name__)

_STALE_WAIT_SLICE = 1.0
_PRESENCE_CONNECT_TIMEOUT = 2.0
_PRESENCE_POLL = 0.5
_STOP_JOIN = 0.3
# How often a running member looks whether the job completed elsewhere (one read).
_COMPLETION_CHECK_S = 1.0


# The presence holder's program (stdlib only, run by ``sys.executable -c``): accept
# on the inherited listening socket (fd argv[1]), hold every link, drop one when its
# watcher closes it, and exit when stdin reads EOF (the agent closed it or is gone).
# SIGTERM/SIGINT are the agent's to handle (a leave is announced as MemberLeft first):
# a signal sent to the whole process group must not close the links before that.
_HOLDER = """
import os, selectors, signal, socket, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
listener = socket.socket(fileno=int(sys.argv[1]))
listener.setblocking(False)
sel = selectors.DefaultSelector()
sel.register(listener, selectors.EVENT_READ)
sel.register(0, selectors.EVENT_READ)
os.write(1, b"ready")
os.close(1)
while True:
    for key, _ in sel.select():
        if key.fileobj == 0:
            if not os.read(0, 64):
                sys.exit(0)
        elif key.fileobj is listener:
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            conn.setblocking(False)
            sel.register(conn, selectors.EVENT_READ)
        else:
            try:
                data = key.fileobj.recv(64)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                sel.unregister(key.fileobj)
                key.fileobj.close()
"""
_HOLDER_EXIT_WAIT = 2.0
_HOLDER_START_WAIT = 30.0


class PresenceServer:
    """Accepts the ring predecessor's presence connections and holds them for the agent's life.

    It never sends anything: the only message is the kernel closing the
    connections when the pod's processes die. They are held by a small child
    process (stdlib only), not by the agent: the kernel closes a dying
    process's sockets only after tearing down its address space, and the
    agent's (torch, for the workers' store) took 45-490 ms under load from
    SIGKILL to the watcher's EOF, the child's about a millisecond. The child
    reads its stdin until EOF, so it exits with the agent whatever kills it
    (a lone agent death then closes the links when the agent's own exit
    closes that pipe: as fast as before).
    """

    def __init__(self, host: str = "") -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, 0))
            sock.listen(64)
            self.port = int(sock.getsockname()[1])
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-c", _HOLDER, str(sock.fileno())],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                pass_fds=(sock.fileno(),),
            )
        finally:
            sock.close()  # the child's copy is the one that listens
        # Ready once its signal handling is set (and before any peer can need it).
        assert self._proc.stdout is not None
        ready, _, _ = select.select([self._proc.stdout], [], [], _HOLDER_START_WAIT)
        said = self._proc.stdout.read(5) if ready else b""
        self._proc.stdout.close()
        if said != b"ready":
            self.close()
            raise OSError(f"presence holder did not start (said {said!r})")

    @property
    def pid(self) -> int:
        """The holder process (the links close when it exits)."""
        return self._proc.pid

    def close(self) -> None:
        if self._proc.stdin is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
        try:
            self._proc.wait(_HOLDER_EXIT_WAIT)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(_HOLDER_EXIT_WAIT)


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
        self._job_completed_at: float | None = None
        self._threads: list[threading.Thread] = []
        self._conn: socket.socket | None = None

    @property
    def event(self) -> RoundEvent | None:
        with self._lock:
            return self._event

    @property
    def job_completed_at(self) -> float | None:
        """Unix time this monitor first saw the job closed as succeeded (by a member that
        finished), None until then: the completion grace's clock (``supervise``)."""
        with self._lock:
            return self._job_completed_at

    def _watch_completion(self, rdzv: Rendezvous, beats: int) -> None:
        """Every ~second of heartbeats, look whether another member finished the job."""
        every = max(1, round(_COMPLETION_CHECK_S / max(self._settings.heartbeat_interval, 1e-3)))
        if beats % every or self.job_completed_at is not None:
            return
        try:
            closure = rdzv.job_closure()
        except RendezvousError:  # unreadable: not proof the job completed
            return
        if closure is not None and closure[0] == "succeeded":
            with self._lock:
                self._job_completed_at = time.time()
            self._wake.set()

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
            incarnation = self._rdzv.incarnation()
            self._lease.grant(self._result.round, incarnation, since)
        hb_rdzv = self._rdzv.clone()
        stale_rdzv = self._rdzv.clone()
        self._threads = [
            threading.Thread(target=self._heartbeat, args=(hb_rdzv,), daemon=True, name="hb"),
            threading.Thread(
                target=self._watch_stale, args=(stale_rdzv,), daemon=True, name="stale"
            ),
        ]
        succ = self._result.successor
        if succ is not None and self._result.nodes[succ].watch_port > 0:
            presence_rdzv = self._rdzv.clone()
            self._threads.append(
                threading.Thread(
                    target=self._watch_presence, args=(presence_rdzv,), daemon=True, name="pres"
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

    def _heartbeat(self, rdzv: Rendezvous) -> None:
        """Beat, renew the lease, judge the successor; ``rdzv`` is this thread's own view."""
        round_no, me = self._result.round, self._result.node_rank
        succ = self._result.successor
        tracker = ProgressTracker(self._settings.timeout)
        stale = False
        beats = 0
        try:
            while not self._stop.is_set():
                since = self._clock()
                rdzv.beat(round_no, me)
                beats += 1
                self._watch_completion(rdzv, beats)
                stale = stale or rdzv.is_stale(round_no)
                declared = stale and me in {r for r, _ in rdzv.lost(round_no)}
                if self._lease is not None and not declared:
                    # Not declared lost: our workers may go on (and checkpoint
                    # while they stop, when the round ended for another reason).
                    self._lease.renew(since)
                if succ is not None and not stale:
                    value = rdzv.heartbeat(round_no, succ)
                    if tracker.observe(value, self._clock()) and not rdzv.finished(round_no, succ):
                        self._mark_lost(
                            rdzv, succ, f"node rank {succ} stopped heartbeating", SILENT
                        )
                self._stop.wait(self._settings.heartbeat_interval)
        except StoreUnavailableError as exc:
            self._report(RoundEvent(RestartReason.STORE_LOST, str(exc)))
        finally:
            rdzv.close()

    def _mark_lost(self, rdzv: Rendezvous, succ: int, detail: str, how: str) -> None:
        round_no = self._result.round
        if rdzv.finished(round_no, succ):
            return  # it finished and exited: not a loss
        if rdzv.is_stale(round_no):
            return  # the round is over already: the peer may just have moved on
        rdzv.record_lost(round_no, succ, how)
        if rdzv.claim_stale(round_no, RestartReason.MEMBER_LOST, detail):
            log.warning("round %d: %s", round_no, detail)

    def _watch_presence(self, rdzv: Rendezvous) -> None:
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
                            rdzv,
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
            rdzv.close()

    def _watch_stale(self, rdzv: Rendezvous) -> None:
        round_no = self._result.round
        try:
            while not self._stop.is_set():
                if rdzv.wait_stale(round_no, max(_STALE_WAIT_SLICE, rdzv.wait_slice)):
                    mark = rdzv.stale_mark(round_no)
                    if mark is None:
                        continue
                    self._report(RoundEvent(mark.reason, mark.detail))
                    return
        except StoreUnavailableError as exc:
            self._report(RoundEvent(RestartReason.STORE_LOST, str(exc)))
        except RendezvousError as exc:
            self._report(RoundEvent(RestartReason.STORE_LOST, f"unreadable stale mark: {exc}"))
        finally:
            rdzv.close()


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
    peers = [i for i in range(result.num_nodes) if i != result.node_rank]

    def sample() -> dict[int, int | None]:
        return {i: rdzv.heartbeat(result.round, i) for i in peers}

    before = sample()
    window = max(window, 2.5 * settings.heartbeat_interval)
    if rdzv.wait_stale(result.round, window):
        return rdzv.stale_mark(result.round)
    after = sample()
    for i in peers:
        if after[i] == before[i] and not rdzv.finished(result.round, i):
            if rdzv.stale_mark(result.round) is None:
                rdzv.record_lost(result.round, i, SILENT)
            return rdzv.mark_stale(
                result.round,
                RestartReason.MEMBER_LOST,
                f"node rank {i} stopped heartbeating (seen after a worker failure)",
            )
    return rdzv.stale_mark(result.round)
