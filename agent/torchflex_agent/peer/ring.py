"""The state API's peer copy for sharded state: each rank's shard also kept by its ring successor.

Where it sits: used by ``state.TrainState(sharded=True)`` in training scripts
(it imports torch; the agent never imports it). The decisions are pure in
``memstate.logic.shards``; the files are ``memstate.shm.CopyStore`` slots; this module
moves bytes.

Under FSDP or ZeRO each rank holds a different shard, so the copy in a rank's
own agent folder is not enough: when the member dies, its shard must still
exist somewhere. After ``commit(step)`` writes a rank's own copy, the same
bytes (header line and payload, the copy file's format) go to its ring
successor in the current group, a rank on another node
(``memstate.logic.shards.ring_order``), over a gloo side group made once per round
(``dist.new_group``: CPU bytes, whatever the training backend). The send
is posted (``isend``) and left to gloo: the main thread goes on with the
next step and only waits for it at the next commit. A receiver thread per
rank takes its predecessor's length, then its bytes, and writes them
(fenced, exactly like the own copy) as the ``peer`` slot of its agent's
folder, milliseconds after the commit. Both sides keep the copy before too
(``prev``, ``peer-prev``, a hard link): a shard whose newest step died with
its member before reaching the peer is still whole one step back.

``restore`` gathers every rank's slot headers, lets ``memstate.logic.shards`` choose
the key and a holder per shard, and sends each rank its shard over the side
group (a length, then the bytes; a rank holding its own shard loads it
locally).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import threading
from typing import Any

import torch
import torch.distributed as dist

from torchflex_agent.memstate.logic.copies import CopyMeta
from torchflex_agent.memstate.logic.shards import (
    PEER,
    PEER_PREVIOUS,
    SLOTS,
    Held,
    ShardPlan,
    plan_shards,
    ring_neighbours,
)
from torchflex_agent.memstate.shm import CopyStore
from torchflex_agent.peer.collectives import all_gather_json

log = logging.getLogger(__name__)

_RING_TAG = 0
_RESTORE_TAG = 1
_SIDE_TIMEOUT = datetime.timedelta(seconds=60)
"""The side group's timeout: a send to a frozen successor fails after it (the
training's own collectives are stuck with that member too)."""
_CLOSE_WAIT_S = 2.0
"""How long ``close`` waits for the receiver to stop and the last send to go out."""
_MAX_HEADER_BYTES = 4096


class PeerRing:
    """One round's peer-copy transport: a gloo side group, posted sends, a receiver thread."""

    def __init__(self, store: CopyStore) -> None:
        self._store = store
        self._group: Any = None
        self._succ = self._pred = -1
        self._broken = False
        """The last send failed (the successor is gone): no more sends this round."""
        self._sends: list[Any] = []
        """The posted sends' work handles, in order."""
        self._sent: list[torch.Tensor] = []
        """Their tensors: a posted send reads its tensor until it completes."""
        self._receiver: _Receiver | None = None
        self.received = 0
        """Peer copies this rank wrote (for tests and logs)."""

    def ensure_open(self) -> Any:
        """The side group of the current process group and this rank's ring neighbours
        (made once per round: collective)."""
        if self._group is None:
            group = dist.new_group(backend="gloo", timeout=_SIDE_TIMEOUT)
            node = os.environ.get("GROUP_RANK", "")
            nodes = all_gather_json(int(node) if node.isdigit() else None, group)
            self._succ, self._pred = ring_neighbours(nodes, dist.get_rank())
            self._group = group
        return self._group

    def send(self, meta: CopyMeta, payload: bytes | None) -> None:
        """Post this rank's committed copy to its successor (returns at once); ``None``
        when the write was refused: an empty message keeps the ring in lockstep."""
        if not dist.is_initialized() or dist.get_world_size() < 2:
            return
        group = self.ensure_open()
        receiver = self._start_receiver(group)
        receiver.expect()
        if self._broken:
            return
        data = bytearray()
        if payload is not None:
            data += meta.header()
            data += payload
        try:
            self._finish_sends(None)  # the previous step's: long done but for a slow peer
            size = torch.tensor([len(data)], dtype=torch.int64)
            self._sent = [size]
            self._sends = [group.send([size], self._succ, _RING_TAG)]
            if data:
                buf = torch.frombuffer(data, dtype=torch.uint8)
                self._sent.append(buf)
                self._sends.append(group.send([buf], self._succ, _RING_TAG))
        except RuntimeError as exc:  # the successor is gone: the round is over anyway
            log.info("peer ring: a copy did not reach the successor (%s)", exc)
            self._broken, self._sends, self._sent = True, [], []

    def close(self) -> None:
        """End this round's ring: the receiver takes the copies due and stops, the last
        send goes out (both bounded), the side group is dropped. Call before leaving the
        process group."""
        receiver, self._receiver = self._receiver, None
        if receiver is not None:
            receiver.stop()
            receiver.join(_CLOSE_WAIT_S)
        try:
            self._finish_sends(_CLOSE_WAIT_S)
        except RuntimeError as exc:  # the successor is gone
            log.info("peer ring: the last copy did not reach the successor (%s)", exc)
        self._sends, self._sent = [], []
        self._group = None
        self._broken = False

    def restore(self, current: str) -> tuple[ShardPlan, bytes] | None:
        """The group's resume point and this rank's shard of it (collective), or None."""
        group = self.ensure_open() if dist.is_initialized() else None
        mine = [Held(slot, m) for slot in SLOTS if (m := self._store.read_meta(slot)) is not None]
        held = [mine] if group is None else _all_gather_held(mine, group)
        plan = plan_shards(held, current)
        if plan is None:
            return None
        rank = dist.get_rank() if group is not None else 0
        outgoing = []
        for source in plan.sends(rank):
            outgoing.append((source.shard, self._payload(source.slot, plan, source.shard)))
        src = plan.source(rank)
        if src.holder == rank:
            data = self._payload(src.slot, plan, rank)
            if outgoing:
                _exchange(group, outgoing, None)
            return plan, data
        return plan, _exchange(group, outgoing, src.holder)

    def _payload(self, slot: str, plan: ShardPlan, shard: int) -> bytes:
        got = self._store.read(slot)
        want = dataclasses.replace(plan.meta, rank=shard)
        keys = (got[0].key, (got[0].incarnation, got[0].base, got[0].step)) if got else ()
        if got is None or want.key not in keys or got[0].rank != shard:
            raise RuntimeError(f"state copy {slot} changed during restore (expected {want})")
        return got[1]

    def _finish_sends(self, wait_s: float | None) -> None:
        """Wait for the last posted sends (``wait_s``, else the side group's timeout)."""
        for work in self._sends:
            if wait_s is None:
                work.wait()
            else:
                work.wait(datetime.timedelta(seconds=wait_s))
        self._sends, self._sent = [], []

    def _start_receiver(self, group: Any) -> _Receiver:
        if self._receiver is None:
            self._receiver = _Receiver(group, self._pred, self._store, self)
            self._receiver.start()
        return self._receiver


class _Receiver(threading.Thread):
    """The predecessor's copies into the ``peer`` slot, one per commit of this rank.

    It posts a receive only once this rank committed the step (``expect``): the
    ring commits in lockstep (every rank commits every step), so the predecessor's
    copy of that step is on its way or the predecessor is dead (its connection
    closes and the wait fails). A gloo wait can be ended by nothing else (not by
    the group's ``abort`` or ``shutdown``, measured, torch 2.13), and a thread
    still in one when its process exits may abort the process (``terminate
    called without an active exception``): so it is never left waiting for a
    copy that is not coming, and ``close`` waits for it briefly.
    """

    def __init__(self, group: Any, pred: int, store: CopyStore, ring: PeerRing) -> None:
        super().__init__(daemon=True, name="torchflex-peer-copy")
        self._group, self._pred, self._store, self._ring = group, pred, store, ring
        self._cv = threading.Condition()
        self._due = 0
        self._stopping = False

    def expect(self) -> None:
        """This rank committed a step: its predecessor's copy of it is due."""
        with self._cv:
            self._due += 1
            self._cv.notify()

    def stop(self) -> None:
        """Stop once every copy due was taken."""
        with self._cv:
            self._stopping = True
            self._cv.notify()

    def run(self) -> None:
        while True:
            with self._cv:
                # Every copy due is taken before stopping: the predecessor's send of
                # it completes only once this side posted its receive.
                self._cv.wait_for(lambda: self._due > 0 or self._stopping)
                if self._due == 0:
                    return
                self._due -= 1
            size = torch.zeros(1, dtype=torch.int64)
            try:
                self._group.recv([size], self._pred, _RING_TAG).wait()
                raw = bytearray(int(size.item()))
                if raw:  # empty: the predecessor's own write was refused (fenced)
                    buf = torch.frombuffer(raw, dtype=torch.uint8)
                    self._group.recv([buf], self._pred, _RING_TAG).wait()
            except RuntimeError as exc:
                log.info("peer ring: the predecessor's connection ended (%s)", exc)
                return
            if raw:
                self._keep(raw)

    def _keep(self, raw: bytearray) -> None:
        view = memoryview(raw)
        end = raw.find(b"\n", 0, _MAX_HEADER_BYTES)
        try:
            meta = CopyMeta.from_header(bytes(view[: end + 1]))
        except ValueError as exc:
            log.warning("peer ring: dropped a malformed copy (%s)", exc)
            return
        fenced = self._store.fence_check()
        if meta.round != fenced.round or meta.incarnation != fenced.incarnation:
            # Only this round's copies: one of another round (a stale sender) must not
            # replace, nor rotate out, the copies this round resumes from.
            why: str | None = f"of another round than this member's ({fenced.round})"
        else:
            why = self._store.write(meta, view[end + 1 :], PEER, previous=PEER_PREVIOUS)
        if why is not None:
            log.warning("peer copy of shard %d step %d refused: %s", meta.rank, meta.step, why)
            return
        self._ring.received += 1


def _exchange(group: Any, outgoing: list[tuple[int, bytes]], incoming: int | None) -> bytes:
    """Send each ``(rank, bytes)`` of ``outgoing`` and receive from ``incoming`` (a length,
    then the bytes; every transfer posted before any is awaited, so no order deadlocks)."""
    sizes = [torch.tensor([len(d)], dtype=torch.int64) for _, d in outgoing]
    got = torch.zeros(1, dtype=torch.int64)
    works = [
        group.send([s], dst, _RESTORE_TAG) for s, (dst, _) in zip(sizes, outgoing, strict=True)
    ]
    if incoming is not None:
        works.append(group.recv([got], incoming, _RESTORE_TAG))
    for w in works:
        w.wait()
    bufs = [torch.frombuffer(bytearray(d), dtype=torch.uint8) for _, d in outgoing]
    works = [group.send([b], dst, _RESTORE_TAG) for b, (dst, _) in zip(bufs, outgoing, strict=True)]
    received = bytearray(int(got.item()) if incoming is not None else 0)
    if incoming is not None and received:
        works.append(
            group.recv([torch.frombuffer(received, dtype=torch.uint8)], incoming, _RESTORE_TAG)
        )
    for w in works:
        w.wait()
    return bytes(received)


def _all_gather_held(mine: list[Held], group: Any) -> list[list[Held]]:
    rows = all_gather_json([{"slot": h.slot, **dataclasses.asdict(h.meta)} for h in mine], group)
    out = []
    for row in rows:
        assert isinstance(row, list)
        out.append([Held(str(f.pop("slot")), CopyMeta(**f)) for f in row])
    return out
