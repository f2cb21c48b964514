"""A job's rendezvous records over a ``KVStore``: everything but joining a round.

Where it sits: the base of ``rendezvous.protocol.Rendezvous`` (which adds joining and
closing rounds). Together with ``rendezvous.node_check`` (the node check's keys,
reached through ``node_check_records``) they are the rendezvous, the only agent
modules that name store keys (layout in ``torchflex_contract.store_keys``; an
import-linter contract in ``pyproject.toml`` keeps it so). Here: the job-wide
state (closure, restart count, incarnation), a round's stale mark, and a
running round's records -- heartbeats, ``finished``, the ``lost`` list, each
member's reported failure -- which ``loop.supervise`` and ``rendezvous.liveness`` call
instead of touching the store. Split from ``rendezvous.protocol`` along that seam: these
are single reads and writes; the protocol's loops stay there.
"""

from __future__ import annotations

import json
import logging
import uuid

from torchflex_agent.errors import StoreProtocolError
from torchflex_agent.rendezvous.logic import (
    NodeDescriptor,
    RendezvousResult,
    RoundPeek,
    RoundView,
    StaleMark,
    decode_job_closure,
    decode_lost,
    decode_membership,
    encode_lost,
    encode_membership,
    parse_counter,
    raise_for_job_closure,
)
from torchflex_agent.rendezvous.node_check import NodeCheckRecords
from torchflex_agent.stores.kvstore import KVStore
from torchflex_contract.progress import RankStall, RestartReason
from torchflex_contract.store_keys import (
    ACTIVITY,
    ARRIVALS,
    CLOSED,
    CURRENT_ROUND,
    FAILURE,
    FAILURE_COUNTED,
    FINISHED,
    HEARTBEAT,
    INCARNATION,
    JOB_CLOSED,
    LOST,
    NODE,
    RESTARTS,
    SPEED,
    STALE,
    STALL,
    WAITING,
    Keys,
    round_key,
)

log = logging.getLogger(__name__)

_LOST_CAS_ATTEMPTS = 16
# Rounds an onlooker steps past its guess in one read (more: the next read goes on).
_PEEK_HOPS = 8


def _restart_count(raw: bytes | None) -> int:
    try:
        return int(raw) if raw is not None else 0
    except ValueError as exc:
        raise StoreProtocolError(f"malformed restart counter {raw!r}") from exc


class RoundRecords:
    """One node's reads and writes of a job's records, over one store connection."""

    def __init__(self, store: KVStore, keys: Keys, node: NodeDescriptor) -> None:
        self._store = store
        self.keys = keys
        self.node = node

    # -- job-wide state -------------------------------------------------

    def job_closure(self) -> tuple[str, str] | None:
        """(outcome, message) if the job's rendezvous is closed."""
        return decode_job_closure(self._store.get(self.keys.key(JOB_CLOSED)))

    def restarts(self) -> int:
        return _restart_count(self._store.get(self.keys.key(RESTARTS)))

    def raise_restarts_to(self, seen: int) -> int:
        """Make the job's restart counter at least ``seen``; returns the counter after.

        A c10d store pod that restarts comes back empty, and with it the
        job-wide restart count. Every agent remembers the highest count it
        has seen and republishes it: a compare-and-set from the value read,
        so concurrent agents never add twice and a count already higher
        (a failure counted meanwhile) is never lowered.
        """
        key = self.keys.key(RESTARTS)
        for _ in range(16):
            raw = self._store.get(key)
            current = _restart_count(raw)
            if current >= seen:
                return current
            self._store.compare_set(key, raw, str(seen).encode())
        return self.restarts()

    def count_failure(self, round_no: int) -> int | None:
        """Count this round's worker failure as one job restart: the first agent to claim
        it (its node id, compare-and-set from absent) adds one and gets the count after;
        the others get None (counted elsewhere)."""
        claim = self.node.node_id.encode()
        key = round_key(self.keys, round_no, FAILURE_COUNTED)
        if self._store.compare_set(key, None, claim) != claim:
            return None
        return self._store.add(self.keys.key(RESTARTS), 1)

    def incarnation(self) -> str:
        """The store's incarnation id (written by the first agent to ask; see store_keys)."""
        mine = uuid.uuid4().hex[:12].encode()
        value = self._store.compare_set(self.keys.key(INCARNATION), None, mine)
        return (value or mine).decode(errors="replace")

    def end_round_after_store_loss(self, round_no: int) -> None:
        """After reconnecting: if the store still holds our round (etcd persists), end it.

        Its members all lost the store at once and stopped their workers; a
        round that still looks closed and healthy would make them wait on it
        as if it were someone else's. An empty store (a restarted c10d store
        pod) holds nothing to end, and a round number reused there is not ours.
        """
        raw = self._store.get(round_key(self.keys, round_no, CLOSED))
        if raw is None:
            return
        if any(n.node_id == self.node.node_id for n in decode_membership(raw)):
            self.mark_stale(round_no, RestartReason.STORE_LOST, self.node.node_id)

    def waiting_count(self, round_no: int) -> int:
        return self._store.tickets(round_key(self.keys, round_no, WAITING))

    def close_job(self, outcome: str, message: str = "") -> None:
        value = json.dumps({"outcome": outcome, "message": message, "by": self.node.node_id})
        self._store.compare_set(self.keys.key(JOB_CLOSED), None, value.encode())

    def _raise_if_job_closed(self) -> None:
        raise_for_job_closure(self.job_closure())

    def _view_keys(self, round_no: int) -> list[str]:
        return [
            self.keys.key(JOB_CLOSED),
            round_key(self.keys, round_no, CLOSED),
            round_key(self.keys, round_no, STALE),
        ]

    def _view(self, round_no: int) -> RoundView:
        """The job closure, the round's membership and its stale mark, in one read."""
        job, closed, stale = self._store.get_many(self._view_keys(round_no))
        return RoundView(job, closed, stale)

    # -- round state ----------------------------------------------------

    def stale_mark(self, round_no: int) -> StaleMark | None:
        raw = self._store.get(round_key(self.keys, round_no, STALE))
        return None if raw is None else StaleMark.decode(raw)

    def mark_stale(self, round_no: int, reason: RestartReason, detail: str = "") -> StaleMark:
        """End a round; the first mark wins and is returned (ours or an earlier one)."""
        mine = StaleMark(reason, self.node.node_id, detail).encode()
        current = self._store.compare_set(round_key(self.keys, round_no, STALE), None, mine)
        return StaleMark.decode(current if current is not None else mine)

    def claim_stale(self, round_no: int, reason: RestartReason, detail: str = "") -> bool:
        """End a round like ``mark_stale``; True if ours was the first mark (nothing decoded)."""
        mine = StaleMark(reason, self.node.node_id, detail).encode()
        return self._store.compare_set(round_key(self.keys, round_no, STALE), None, mine) == mine

    def abort_round(self, round_no: int, reason: RestartReason, detail: str = "") -> None:
        """Mark a forming round stale and close it, so its joiners stop waiting."""
        self.mark_stale(round_no, reason, detail)
        self._store.compare_set(
            round_key(self.keys, round_no, CLOSED),
            None,
            encode_membership((), closer=f"abort:{self.node.node_id}"),
        )

    def is_stale(self, round_no: int) -> bool:
        return self._store.get(round_key(self.keys, round_no, STALE)) is not None

    def wait_stale(self, round_no: int, timeout: float) -> bool:
        """Block until the round is marked stale; False if ``timeout`` seconds passed first."""
        return self._store.wait([round_key(self.keys, round_no, STALE)], timeout)

    # -- a running round's records --------------------------------------

    def beat(self, round_no: int, node_rank: int) -> None:
        """One heartbeat of a member: its counter goes up by one."""
        self._store.add(round_key(self.keys, round_no, HEARTBEAT, node_rank), 1)

    def heartbeat(self, round_no: int, node_rank: int) -> int | None:
        """A member's heartbeat counter; None if absent or unreadable (no beat)."""
        return parse_counter(self._store.get(round_key(self.keys, round_no, HEARTBEAT, node_rank)))

    def mark_finished(self, round_no: int, node_rank: int) -> None:
        """The member's workers succeeded: its exit is not a loss."""
        self._store.set(round_key(self.keys, round_no, FINISHED, node_rank), b"1")

    def finished(self, round_no: int, node_rank: int) -> bool:
        return self._store.get(round_key(self.keys, round_no, FINISHED, node_rank)) is not None

    def record_lost(self, round_no: int, node_rank: int, how: str) -> None:
        """List a member as lost, ``how`` (``SILENT``/``EXITED``), before marking the round
        stale (compare-and-set, bounded retries); a rank listed already keeps its entry."""
        key = round_key(self.keys, round_no, LOST)
        raw = self._store.get(key)
        for _ in range(_LOST_CAS_ATTEMPTS):
            entries = decode_lost(raw)
            if any(r == node_rank for r, _how in entries):
                return
            desired = encode_lost((*entries, (node_rank, how)))
            now = self._store.compare_set(key, raw, desired)
            if now == desired:
                return
            raw = now
        log.warning("round %d: node rank %d not recorded as lost (contention)", round_no, node_rank)

    def lost(self, round_no: int) -> tuple[tuple[int, str], ...]:
        """The round's lost list: ((node rank, how), ...) in the order recorded."""
        return decode_lost(self._store.get(round_key(self.keys, round_no, LOST)))

    def report_failure(self, round_no: int, node_rank: int, message: str) -> None:
        """Publish the worker failure this member saw, for the agent that gives up to name."""
        self._store.set(round_key(self.keys, round_no, FAILURE, node_rank), message.encode())

    def peer_failures(self, result: RendezvousResult) -> list[str]:
        """The failures the other members of ``result``'s round reported, in node-rank order."""
        ranks = (r for r in range(result.num_nodes) if r != result.node_rank)
        raws = [self._store.get(round_key(self.keys, result.round, FAILURE, r)) for r in ranks]
        return [raw.decode(errors="replace") for raw in raws if raw]

    # -- progress and declared hangs (loop.stalls) ------------------------

    def add_activity(self, round_no: int) -> int:
        """This member's workers made progress: the round's activity counter goes up."""
        return self._store.add(round_key(self.keys, round_no, ACTIVITY), 1)

    def activity(self, round_no: int) -> int | None:
        """The round's activity counter; None while nobody made progress."""
        return parse_counter(self._store.get(round_key(self.keys, round_no, ACTIVITY)))

    def put_stall(self, round_no: int, node_rank: int, entries: list[RankStall]) -> None:
        """This member's ranks as they were when the round was declared hung."""
        raw = json.dumps([e.to_dict() for e in entries]).encode()
        self._store.set(round_key(self.keys, round_no, STALL, node_rank), raw)

    def stalls(self, round_no: int, num_nodes: int) -> dict[int, list[RankStall]]:
        """Every member's entries written so far (node rank -> its ranks); malformed ones
        are skipped, not fatal: the report is evidence, not a decision."""
        keys = [round_key(self.keys, round_no, STALL, i) for i in range(num_nodes)]
        out: dict[int, list[RankStall]] = {}
        for node_rank, raw in enumerate(self._store.get_many(keys)):
            if raw is None:
                continue
            try:
                out[node_rank] = [RankStall.from_dict(e) for e in json.loads(raw)]
            except (ValueError, TypeError, KeyError) as exc:
                log.warning("round %d: node %d: bad stall entry: %s", round_no, node_rank, exc)
        return out

    def put_speed(self, round_no: int, node_rank: int, forward_s: float, seq: int) -> None:
        """This member's mean forward time over its latest window (``seq``: which one)."""
        raw = json.dumps({"forward_s": forward_s, "seq": seq}).encode()
        self._store.set(round_key(self.keys, round_no, SPEED, node_rank), raw)

    def speeds(self, round_no: int, num_nodes: int) -> dict[int, tuple[float, int]]:
        """Every member's latest (mean forward seconds, window seq); unreadable ones skipped."""
        keys = [round_key(self.keys, round_no, SPEED, i) for i in range(num_nodes)]
        out: dict[int, tuple[float, int]] = {}
        for node_rank, raw in enumerate(self._store.get_many(keys)):
            if raw is None:
                continue
            try:
                data = json.loads(raw)
                out[node_rank] = (float(data["forward_s"]), int(data["seq"]))
            except (ValueError, TypeError, KeyError):
                continue
        return out

    def node_check_records(self) -> NodeCheckRecords:
        """The node check's records (peers' figures, the pairing lobby) on this connection."""
        return NodeCheckRecords(self._store, self.keys, self.node)

    # -- another role's rounds (loop.roster) ----------------------------

    def for_run(self, run_id: str) -> RoundRecords:
        """The records of another key id (another role of the job) on this connection."""
        return RoundRecords(self._store, Keys(run_id), self.node)

    def peek_round(self, guess: int) -> RoundPeek:
        """The newest closed round as an onlooker sees it, and whether a newer one forms.

        ``CURRENT_ROUND`` is only a hint (members re-join at ``round + 1`` without
        moving it), so the read starts at the later of it and ``guess`` and steps
        on while the next round closed too. One request while the round stays
        the same (plus one for the hint); writes nothing.
        """
        hint_raw, *got = self._store.get_many([self.keys.key(CURRENT_ROUND), *self._peek(guess)])
        hint = parse_counter(hint_raw)
        if hint is None:
            return RoundPeek(-1, None, False, True)
        round_no = max(guess, hint)
        if round_no != guess:
            got = self._store.get_many(self._peek(round_no))
        for _ in range(_PEEK_HOPS):
            closed, stale, next_closed, next_arrivals = got
            if next_closed is None:
                break
            round_no += 1
            got = self._store.get_many(self._peek(round_no))
        if closed is not None:
            members = decode_membership(closed)
            return RoundPeek(round_no, members, stale is not None, next_arrivals is not None)
        if round_no > 0:  # round_no is open: its members are still the last round's
            (before,) = self._store.get_many([round_key(self.keys, round_no - 1, CLOSED)])
            if before is not None:
                return RoundPeek(round_no - 1, decode_membership(before), True, True)
        return RoundPeek(round_no, None, stale is not None, True)

    def arrived(self, round_no: int, count: int) -> list[NodeDescriptor]:
        """The descriptors of a round's first ``count`` arrivals that published one."""
        keys = [round_key(self.keys, round_no, NODE, i) for i in range(count)]
        raws = self._store.get_many(keys) if keys else []
        return [NodeDescriptor.from_json(json.loads(raw)) for raw in raws if raw is not None]

    def _peek(self, round_no: int) -> list[str]:
        return [
            round_key(self.keys, round_no, CLOSED),
            round_key(self.keys, round_no, STALE),
            round_key(self.keys, round_no + 1, CLOSED),
            round_key(self.keys, round_no + 1, ARRIVALS),
        ]
