"""The rendezvous protocol over a ``KVStore``: join a round, close it, leave it.

Where it sits: the agent loop calls ``Rendezvous.next_round`` to become a
member of a closed round (its node rank, the membership, the master
address), ``mark_stale`` when the round must end (worker failure, lost
peer, leaving), and ``close_job`` when the job is over. A running round's
records (heartbeats, ``finished``, the ``lost`` list, reported failures, the
job's restart count) and stale marks are the base class's, ``rendezvous.records``,
which ``loop.supervise`` and ``rendezvous.liveness`` call instead of touching the store.
Decisions come from ``rendezvous.logic``; this module and ``rendezvous.records`` only read
and write keys (layout in ``torchflex_contract.store_keys``), and they are the
only agent modules that do (an import-linter contract in ``pyproject.toml``
keeps it so).

Protocol for round r (one pass, a handful of round trips per node; each
step in docs/agent.md, "Rendezvous protocol"): a stale round is skipped; a
closed one is waited out (counted in ``r/waiting``, marked stale
MemberJoined if it has room; a *full* round's members are watched meanwhile,
and ended MemberLost if all are gone, since nobody else is left to end it);
otherwise ``take_ticket(r/arrivals)`` gives our arrival index i, we publish
``r/node/i`` and block on ``r/closed`` until the arrival that reaches max,
or anyone once min arrived and the last call passed, closes it. Exactly one
``compare_set(r/closed, absent, membership)`` wins; indices below its count
are members (ordered by ``rendezvous.logic.rank_order``: the previous ranks kept,
so a re-formed group keeps its warm rank 0), the rest wait for r+1.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable

from torchflex_agent.errors import (
    RendezvousError,
    RendezvousTimeoutError,
    StoreProtocolError,
)
from torchflex_agent.rendezvous.logic import (
    EXITED,
    SILENT,
    ArrivalRole,
    MemberWatch,
    NodeDescriptor,
    RendezvousResult,
    RendezvousSettings,
    RoundView,
    StaleMark,
    Standing,
    arrival_role,
    close_decision,
    decode_job_closure,
    decode_membership,
    encode_membership,
    joint_members,
    joint_room,
    raise_for_job_closure,
    rank_order,
    role_counts,
    standing,
    waiter_marks_stale,
)
from torchflex_agent.rendezvous.presence_probe import refused
from torchflex_agent.rendezvous.records import RoundRecords
from torchflex_agent.stores.kvstore import KVStore
from torchflex_contract.progress import RestartReason
from torchflex_contract.store_keys import (
    ARRIVALS,
    CLOSED,
    CURRENT_ROUND,
    NODE,
    WAITING,
    Keys,
    round_key,
)

log = logging.getLogger(__name__)

# How long the closer waits for a counted joiner to publish its descriptor
# (it does so right after taking its ticket; missing means it died in between).
_DESCRIPTOR_WAIT = 3.0
# How long a joiner that finds the round full waits for its last arrival (the
# closer, which closes at once) before closing it itself: the most a closer
# that died between its ticket and its close delays the round.
_CLOSER_GRACE = 2.0
_MAX_ROUND_HOPS = 10_000


class RendezvousInterruptedError(RendezvousError):
    """The caller's stop event was set (SIGTERM) while waiting; we left cleanly."""


class Rendezvous(RoundRecords):
    """One node's view of a job's rendezvous, over one store connection.

    The connection serves one thread at a time (see ``stores.kvstore``): a thread
    that blocks works on its own view from ``clone()``. The records it reads
    and writes outside joining (heartbeats, stale marks, ...) are its base's.
    """

    def __init__(
        self,
        store: KVStore,
        run_id: str,
        node: NodeDescriptor,
        settings: RendezvousSettings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(store, Keys(run_id), node)
        self.settings = settings
        self._clock = clock

    def clone(self) -> Rendezvous:
        """The same view over a new store connection of its own; ``close()`` it after."""
        return Rendezvous(
            self._store.clone(), self.keys.run_id, self.node, self.settings, self._clock
        )

    def close(self) -> None:
        """Close the connection of a ``clone()`` (the caller that opened a store closes it)."""
        self._store.close()

    @property
    def wait_slice(self) -> float:
        """How long one blocking wait of a polling loop should last (``KVStore.wait_slice``)."""
        return self._store.wait_slice

    def _advance(self, round_no: int) -> int:
        """Move to the next round, or further if the hint already points further."""
        now = self._store.compare_set(
            self.keys.key(CURRENT_ROUND), str(round_no).encode(), str(round_no + 1).encode()
        )
        try:
            hint = int(now) if now is not None else 0
        except ValueError:
            hint = 0
        return max(round_no + 1, hint)

    def current_round_hint(self) -> int:
        key = self.keys.key(CURRENT_ROUND)
        raw = self._store.get(key)
        if raw is None:
            # Created as "0" (what add(0) would write) so later compare_sets
            # have a value to match; a compare_set, not add(0), because N
            # joiners of a fresh job race here and on etcd a lost create is
            # then one request, not a read-modify-write loop.
            raw = self._store.compare_set(key, None, b"0") or b"0"
        try:
            return int(raw)
        except ValueError as exc:
            raise StoreProtocolError(f"malformed current round {raw!r}") from exc

    # -- joining --------------------------------------------------------

    def next_round(
        self,
        min_round: int = 0,
        stop: threading.Event | None = None,
        expected: int | None = None,
    ) -> RendezvousResult:
        """Block until this node is a member of a closed, healthy round.

        ``expected``: how many nodes should come (``rendezvous.logic.expected_next``);
        the round closes as soon as they have, without the last call.
        Raises ``RendezvousTimeoutError`` after the join timeout,
        ``RendezvousInterruptedError`` when ``stop`` is set, and the job-closed
        errors when the job is over. Store errors propagate.
        """
        deadline = self._clock() + self.settings.join_timeout
        round_no = max(min_round, self.current_round_hint())
        for _ in range(_MAX_ROUND_HOPS):
            # One read, as if the job closure, the stale mark and the
            # membership were read one after the other at the same instant.
            view = self._view(round_no)
            raise_for_job_closure(decode_job_closure(view.job_closed))
            if view.stale is not None:
                StaleMark.decode(view.stale)  # a malformed mark still raises, as before
                round_no = self._advance(round_no)
                continue
            if view.closed is not None:
                self._wait_out_round(round_no, decode_membership(view.closed), deadline, stop)
                round_no = self._advance(round_no)
                continue
            result = self._join(round_no, deadline, stop, expected)
            if result is not None:
                return result
            round_no = self._advance(round_no)
        raise RendezvousTimeoutError(f"no usable round after {_MAX_ROUND_HOPS} rounds")

    def _check_deadline(
        self,
        round_no: int,
        deadline: float,
        stop: threading.Event | None,
        joined: bool,
        view: RoundView | None = None,
    ) -> None:
        """Raise if stopped, the job closed or the deadline passed; ``view``: a fresh read."""
        if stop is not None and stop.is_set():
            if joined:
                self.abort_round(round_no, RestartReason.MEMBER_LEFT, "left while joining")
            raise RendezvousInterruptedError(f"stopped while in round {round_no}")
        # A job failed meanwhile (a bad command, the restart budget spent
        # elsewhere) ends every wait here, not just the next round's start.
        if view is None:
            self._raise_if_job_closed()
        else:
            raise_for_job_closure(decode_job_closure(view.job_closed))
        if self._clock() >= deadline:
            arrivals = self._store.tickets(round_key(self.keys, round_no, ARRIVALS))
            if joined:
                self.abort_round(round_no, RestartReason.MEMBER_LEFT, "join timeout")
            raise RendezvousTimeoutError(
                f"rendezvous round {round_no}: {arrivals} of min {self.settings.min_nodes} "
                f"nodes (max {self.settings.max_nodes}) joined within "
                f"{self.settings.join_timeout:g}s"
            )

    def _wait_out_round(
        self,
        round_no: int,
        nodes: tuple[NodeDescriptor, ...],
        deadline: float,
        stop: threading.Event | None,
    ) -> None:
        """We arrived after closure: ask to be let in, then wait for the round to end.

        A full round is watched while we wait (``MemberWatch``): its members
        end it themselves when one of them leaves or dies, but if all are
        gone nobody would, and we would wait out the join timeout.
        """
        self._store.take_ticket(round_key(self.keys, round_no, WAITING))
        room = waiter_marks_stale(len(nodes), self.settings.max_nodes)
        if self.settings.roles:  # Joint: room for our role, not just any node
            room = joint_room(nodes, self.node.role, self.settings.roles)
        if room:
            self.mark_stale(round_no, RestartReason.MEMBER_JOINED, self.node.node_id)
            return
        gone = refused([(n.addr, n.watch_port) for n in nodes])
        if gone and self._end_round_of_gone(round_no, gone, exited=True):
            return
        watch = MemberWatch(self.settings.liveness_timeout)
        while not self.wait_stale(round_no, self.wait_slice):
            self._check_deadline(round_no, deadline, stop, joined=False)
            beats = {rank: self.heartbeat(round_no, rank) for rank in range(len(nodes))}
            stalled = watch.observe(beats, self._clock())
            if stalled and self._end_round_of_gone(round_no, list(stalled), exited=False):
                return

    def _end_round_of_gone(self, round_no: int, ranks: list[int], *, exited: bool) -> bool:
        """Mark a full round stale for members found gone; False if all of them finished.

        The ranks go to the round's ``lost`` list first, as a member's own
        detector would record them: a member that was only frozen reads it
        when it wakes up and fences itself instead of checkpointing over the
        group that formed without it.
        """
        ranks = [r for r in ranks if not self.finished(round_no, r)]
        if not ranks or self.stale_mark(round_no) is not None:
            return bool(ranks)
        for rank in ranks:
            self.record_lost(round_no, rank, EXITED if exited else SILENT)
        how = "refused presence connections" if exited else "stopped heartbeating"
        detail = (
            f"node rank(s) {', '.join(map(str, ranks))} of a full round {how} "
            "(seen by a waiting joiner)"
        )
        mark = self.mark_stale(round_no, RestartReason.MEMBER_LOST, detail)
        log.warning("round %d: %s; ending it", round_no, mark.detail)
        return True

    def _join(
        self,
        round_no: int,
        deadline: float,
        stop: threading.Event | None,
        expected: int | None = None,
    ) -> RendezvousResult | None:
        """Arrive in an open round; None if we ended up waiting or the round died."""
        index = self._store.take_ticket(round_key(self.keys, round_no, ARRIVALS)) - 1
        self._store.set(
            round_key(self.keys, round_no, NODE, index), json.dumps(self.node.to_json()).encode()
        )
        log.debug("round %d: arrived as index %d", round_no, index)
        if arrival_role(index, self.settings.max_nodes) is ArrivalRole.CLOSER:
            self._try_close(round_no, self.settings.max_nodes)
        closed_key = round_key(self.keys, round_no, CLOSED)
        min_reached_at: float | None = None
        deferred = False
        fallback = max(2 * self.settings.last_call, self._store.wait_slice)
        # Each pass reads the job closure, membership and stale mark at once:
        # after a wait that one read serves the deadline check, the loop's
        # test and the stale test below (three requests before, one now).
        view = self._view(round_no)
        while True:
            raw = view.closed
            if raw is not None:
                break
            arrivals = self._store.tickets(round_key(self.keys, round_no, ARRIVALS))
            decision = close_decision(
                now=self._clock(),
                arrivals=arrivals,
                settings=self.settings,
                min_reached_at=min_reached_at,
                fallback_wait=fallback,
                expected=expected,
                role_counts=self._role_counts(round_no, arrivals),
            )
            min_reached_at = decision.min_reached_at
            if decision.close:
                if arrivals < self.settings.max_nodes:  # full stays full: no re-read
                    arrivals = self._store.tickets(round_key(self.keys, round_no, ARRIVALS))
                elif not deferred and arrival_role(index, self.settings.max_nodes) is not (
                    ArrivalRole.CLOSER
                ):
                    # Full: its last arrival closes it at once. Give it a grace
                    # before racing it, or all N joiners read all N descriptors
                    # (O(N^2): 1,024 agents overloaded etcd and the c10d store).
                    deferred = True
                    self._store.wait([closed_key], _CLOSER_GRACE)
                # Closed since our last read (by the closer, usually)? A small
                # read first: N joiners each reading all N descriptors of a
                # round that is closed already is O(N^2) for the store.
                view = self._view(round_no)
                if view.closed is None:
                    count = min(arrivals, self.settings.max_nodes)
                    view = self._try_close(round_no, count) or self._view(round_no)
                continue
            self._store.wait([closed_key], min(decision.wait, self._store.wait_slice))
            view = self._view(round_no)
            self._check_deadline(round_no, deadline, stop, joined=True, view=view)
        if view.stale is not None:
            StaleMark.decode(view.stale)  # a malformed mark still raises, as before
            return None
        nodes = decode_membership(raw)
        waiter = standing(index, len(nodes)) is Standing.WAITER
        if self.settings.roles:  # Joint: admitted by role, not by arrival order
            waiter = all(n.node_id != self.node.node_id for n in nodes)
        if waiter:
            self._wait_out_round(round_no, nodes, deadline, stop)
            return None
        ranks = [i for i, n in enumerate(nodes) if n.node_id == self.node.node_id]
        if len(ranks) != 1:
            raise StoreProtocolError(
                f"round {round_no}: admitted as arrival {index} but listed {len(ranks)} times"
            )
        return RendezvousResult(round=round_no, node_rank=ranks[0], nodes=nodes)

    def _role_counts(self, round_no: int, arrivals: int) -> dict[str, int] | None:
        """A Joint round's arrivals per role (their descriptors read); None otherwise."""
        if not self.settings.roles:
            return None
        return role_counts(self.arrived(round_no, arrivals))

    def _try_close(self, round_no: int, count: int) -> RoundView | None:
        """Close the round with the first ``count`` arrivals (one writer wins).

        Returns the round's view if it was closed already (nothing written),
        read with the descriptors; None after our own compare_set.
        """
        node_keys = [round_key(self.keys, round_no, NODE, i) for i in range(count)]
        closed_key = round_key(self.keys, round_no, CLOSED)
        # One read of all descriptors (a range on etcd), not one per key, and
        # of the round's view: closed already, our compare_set could only lose.
        *raws, job, closed, stale = self._store.get_many([*node_keys, *self._view_keys(round_no)])
        if closed is not None:
            log.debug("round %d: closed already", round_no)
            return RoundView(job, closed, stale)
        missing = [key for key, raw in zip(node_keys, raws, strict=True) if raw is None]
        if missing:
            if self._store.wait(missing, _DESCRIPTOR_WAIT):
                raws = self._store.get_many(node_keys)
            else:
                # A joiner died between its add and its descriptor: admit the
                # contiguous prefix that did publish; the rest wait for round r+1.
                raws = self._store.get_many(node_keys)
                count = next((i for i, raw in enumerate(raws) if raw is None), count)
                node_keys, raws = node_keys[:count], raws[:count]
        nodes = []
        for key, raw in zip(node_keys, raws, strict=True):
            if raw is None:
                raise StoreProtocolError(f"descriptor {key} vanished")
            nodes.append(NodeDescriptor.from_json(json.loads(raw)))
        roles = self.settings.roles
        members = joint_members(nodes, roles) if roles else rank_order(nodes)
        value = encode_membership(members, closer=self.node.node_id)
        won = self._store.compare_set(closed_key, None, value) == value
        log.debug("round %d: close with %d nodes, won=%s", round_no, count, won)
        return None
