"""The opt-in state API: resume from the last completed step, from memory, after a loss.

Where it sits: imported by training scripts only (``examples/train_stateful.py``),
never by the agent process (it imports torch). It keeps each step's state in
the agent's in-memory folder through ``memstate.shm`` and decides whose copy to
resume from with ``memstate.logic.copies``. In a script::

    from torchflex_agent.state import TrainState

    state = TrainState(model=model, optimizer=opt)   # anything with state_dict()
    got = state.restore()          # collective, after init_process_group
    start = got.step if got else 0 # None: nobody holds a copy (load disk, or fresh)
    for step in range(start + 1, total + 1):
        ...                        # forward, backward, optimizer step
        state.commit(step, loop={"epoch": epoch})   # after each completed step

``commit`` serializes the registered objects' ``state_dict()`` (a copy, not
a view of the live tensors) and writes it with its fenced key
``(incarnation, round, step)`` over this node's copy in ``/dev/shm``, outside
the worker process: when a member is lost and the agent restarts the workers,
the new workers find it there. ``restore`` (every rank, right after
``init_process_group``) gathers each rank's copy key, picks the newest usable
one (``memstate.logic.copies.choose_source``: a stale member's copy is never used), and
either lets every rank load its own (all hold that key: no transfer) or
broadcasts it from its holder (a replacement or new member holds nothing).
No disk is read. Without ``torchflex-agent`` (no ``TORCHFLEX_STATE_DIR``)
``commit`` keeps nothing and ``restore`` returns None: the script runs as before.

With ``in_place=True`` the survivors of a member that joined, left, died or
froze keep their processes: the agent keeps them (``kept``) and hands them the
new round, and ``reform`` re-creates the process group and restores, without a
new process or import (see the example's loop and docs/state-api.md). After a
loss a watcher thread (``memstate.unblock``) shuts the old group's links down on
the agent's word, so a collective waiting on the lost member fails at once.

State is *replicated* by default (DDP: every rank holds the same model and
optimizer after a step), so any survivor's copy is the group's state. With
``sharded=True`` (FSDP, ZeRO: each rank's state differs) each copy also goes
to the rank's ring successor (``peer.ring``), and ``restore`` gives rank r
shard r of the newest step whose shards all have a holder (``memstate.logic.shards``).
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import io
import logging
import os
import time
from collections.abc import Mapping
from typing import Any, Protocol

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from torchflex_agent.fence import Verdict
from torchflex_agent.memstate.logic.copies import CopyMeta, Source, choose_source
from torchflex_agent.memstate.logic.shards import OWN_PREVIOUS
from torchflex_agent.memstate.shm import CopyStore
from torchflex_agent.memstate.unblock import Unblocker, socket_inodes
from torchflex_agent.peer.collectives import all_gather_json
from torchflex_agent.peer.ring import PeerRing
from torchflex_contract import env as tfenv

log = logging.getLogger(__name__)

# How often a worker waiting to re-form in place looks for its next round: the
# rendezvous itself takes a few ms once the survivors' agents are in it.
_ROUND_POLL_S = 0.005


class Stateful(Protocol):
    """What ``TrainState`` registers: a module, an optimizer, an LR scheduler, a sampler..."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state_dict: Any, /) -> Any: ...


@dataclasses.dataclass(frozen=True)
class Restored:
    """What ``restore`` resumed from: the registered objects already hold it."""

    step: int
    loop: dict[str, Any]
    meta: CopyMeta
    broadcast: bool
    """True when the state came from another rank (``meta.rank``'s copy, sent by ``source``)."""
    source: int
    slot: str = "copy"
    """Sharded state: which of the holder's copies it was (``memstate.logic.shards.SLOTS``;
    ``peer``: the shard of a lost member, kept by its ring successor)."""


class TrainState:
    """Registered training state, copied to the agent's memory after every completed step."""

    def __init__(
        self,
        *,
        in_place: bool = False,
        sharded: bool = False,
        environ: Mapping[str, str] | None = None,
        **objects: Stateful,
    ) -> None:
        if not objects:
            raise ValueError("register at least one object with state_dict()/load_state_dict()")
        self._objects = dict(objects)
        self._store = CopyStore(environ)
        self._round = int((os.environ if environ is None else environ).get(tfenv.ROUND, "-1"))
        self._round_over = False
        self.in_place = in_place and self._store.enabled
        """Whether this worker re-forms in place (``reform``) when its agent keeps it."""
        self._unblock: Unblocker | None = None
        self._before_init: frozenset[int] | None = None
        """The process's sockets right before the current group's ``init_process_group``
        (known for the groups ``reform`` makes; None for the first)."""
        if self.in_place:
            self._unblock = _start_unblocker(self._store)
            self._store.declare_in_place()
        self.refused = 0
        """Commits the fence (or a newer copy) refused: this member is no longer in its group."""
        self.peer = PeerRing(self._store) if sharded and self._store.enabled else None
        """Sharded state (each rank's differs): each copy also goes to the ring successor."""

    @property
    def objects(self) -> dict[str, Stateful]:
        """The registered objects by name (e.g. to save the same state to disk)."""
        return dict(self._objects)

    @property
    def enabled(self) -> bool:
        """Whether copies are kept (the script runs under ``torchflex-agent``)."""
        return self._store.enabled

    def commit(
        self, step: int, loop: Mapping[str, Any] | None = None, *, restored_from: int = -1
    ) -> bool:
        """Keep the state after ``step`` (call once the step completed); False if refused.
        ``restored_from``: ``restore``'s own re-commit of a state of that round."""
        if not self._store.enabled:
            return False
        fenced = self._store.fence_check()
        base = restored_from if 0 <= restored_from < fenced.round else -1
        meta = CopyMeta(fenced.incarnation, fenced.round, step, _rank(), _world(), base)
        buf = io.BytesIO()
        payload = {
            "step": step,
            "loop": dict(loop or {}),
            "objects": {name: obj.state_dict() for name, obj in self._objects.items()},
        }
        torch.save(payload, buf)
        data = buf.getvalue()
        # Sharded: the copy replaced is kept too, once this one is sure to land.
        keep = OWN_PREVIOUS if self.peer is not None else None
        why = self._store.write(meta, data, previous=keep)
        if self.peer is not None:
            self.peer.send(meta, data if why is None else None)
        if why is not None:
            # The agent moved on to a new round while we ran: in place, that is the
            # re-form's signal too (the round file may still be a moment away).
            moved_on = self._store.fence_check().verdict is Verdict.OTHER_ROUND
            self._round_over = self._round_over or moved_on
            self.refused += 1
            log.warning("state copy of step %d refused: %s", step, why)
            return False
        return True

    def restore(self) -> Restored | None:
        """Load the group's newest usable copy into the registered objects (collective)."""
        if self.peer is not None and dist.is_available() and dist.is_initialized():
            # The side group first (collective): arming then picks its links to a
            # lost node too, so its receiver and pending send are released with the rest.
            self.peer.ensure_open()
        if self.in_place and dist.is_available() and dist.is_initialized():
            self._arm()
        if self.peer is not None:
            return self._restore_shard(self.peer)
        mine = self._store.read_meta()
        current = self._store.fence_check().incarnation
        copies: list[CopyMeta | None] = [mine]
        if dist.is_available() and dist.is_initialized():
            copies = _all_gather_pickled(mine)
        source = choose_source(copies, current)
        if source is None:
            return None
        data = self._payload(source)
        if data is None:
            return None
        payload = torch.load(io.BytesIO(data), weights_only=True)
        for name, obj in self._objects.items():
            obj.load_state_dict(payload["objects"][name])
        return Restored(
            int(payload["step"]), dict(payload["loop"]), source.meta, source.broadcast, source.rank
        )

    def reform_due(self) -> bool:
        """True when the agent formed a new round around this running worker (a member
        joined or left). One small file read. Agree on it with the group (all-reduce it
        with the step's other flags) and ``reform`` at the same step on every rank: a
        rank that leaves alone would leave its peers in a collective with it."""
        if not self.in_place:
            return False
        return self._round_over or self._store.next_round(self._round) is not None

    def kept(self, wait: float = 5.0) -> bool:
        """After a collective failed: does the agent keep this worker to re-form in place?

        The agent says so within milliseconds of a peer's loss; a failure it does not
        follow with a re-form (a real error, or a loss it handles by restarting the
        workers) answers False after ``wait`` seconds: re-raise the error then.
        """
        if not self.in_place:
            return False
        deadline = time.monotonic() + wait
        while not self._store.kept_past(self._round):
            if self._store.next_round(self._round) is not None:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(_ROUND_POLL_S)
        return True

    def reform(self, wait: float = 60.0, **init_kwargs: Any) -> Restored | None:
        """Leave the process group, wait for the agent's next round, join it, ``restore``.

        Call it when a collective failed and ``kept()`` said yes, or when the group
        agreed on ``reform_due()``, *outside* the ``except`` block and after dropping
        every reference to the old group (the DDP wrapper, the loss): its connections
        close only when it is freed, and a peer blocked on them waits until then.
        ``init_kwargs`` go to ``init_process_group`` (the backend is the current one).
        Raises ``TimeoutError`` when no round comes within ``wait`` seconds (the agent
        took the restart path, or this member was dropped): let it end the worker.
        """
        if not self.in_place:
            raise RuntimeError("reform() needs TrainState(in_place=True) under torchflex-agent")
        backend = dist.get_backend() if dist.is_initialized() else "gloo"
        self.close()
        _leave_group()
        deadline = time.monotonic() + wait
        got = self._store.next_round(self._round)
        while got is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no new round after round {self._round} in {wait:.0f}s")
            time.sleep(_ROUND_POLL_S)
            got = self._store.next_round(self._round)
        self._round, env = got
        self._round_over = False
        os.environ.update(env)  # rank, world size, master, round: what a launch would set
        self._before_init = frozenset(socket_inodes())
        dist.init_process_group(backend, **init_kwargs)
        return self.restore()

    def close(self) -> None:
        """Sharded state: end this round's peer ring (before ``destroy_process_group``)."""
        if self.peer is not None:
            self.peer.close()

    def _restore_shard(self, peer: PeerRing) -> Restored | None:
        """Sharded state: rank r loads shard r of the newest whole key, from whoever holds
        it (``memstate.logic.shards.plan_shards``); None when some shard has no holder or the
        group's size changed (the script loads its disk checkpoint, resharding)."""
        got = peer.restore(self._store.fence_check().incarnation)
        if got is None:
            return None
        plan, data = got
        payload = torch.load(io.BytesIO(data), weights_only=True)
        for name, obj in self._objects.items():
            obj.load_state_dict(payload["objects"][name])
        step, loop = int(payload["step"]), dict(payload["loop"])
        # Kept again under this round's key at once: until every rank commits in this
        # round, its newest round would hold no whole key if another member died. The
        # round it came from goes with it: a re-commit that reached no peer leaves
        # that round's key usable (shard_logic.plan_shards).
        self.commit(step, loop, restored_from=plan.meta.round)
        src = plan.source(_rank())
        meta = dataclasses.replace(plan.meta, rank=src.shard)
        return Restored(step, loop, meta, src.holder != _rank(), src.holder, src.slot)

    def _arm(self) -> None:
        """Collective: every in-place rank picks the new group's links (``memstate.unblock``),
        so that the agent can end a collective that waits on a lost member at once."""
        gather = functools.partial(all_gather_json, device=_collective_device())
        if self._unblock is None or dist.get_backend() != "gloo":
            # NCCL's data does not go through the TCP links (docs/state-api.md):
            # never armed there. Our peers gather with us all the same.
            gather([])
            return
        n = self._unblock.arm(
            self._round,
            rank=_rank(),
            node=int(os.environ.get("GROUP_RANK", "-1") or "-1"),
            gather=gather,
            store_port=int(os.environ.get("MASTER_PORT", "0") or "0"),
            existed_before=self._before_init,
        )
        log.info("round %d: %d group link(s) to shut down if a member is lost", self._round, n)

    def _payload(self, source: Source) -> bytes | None:
        if not source.broadcast:
            got = self._store.read()
            # Every rank saw the same keys a moment ago; a copy that changed since
            # (nothing writes during restore) would be a bug, so say so loudly.
            if got is None or got[0].key != source.meta.key:
                raise RuntimeError(f"state copy changed during restore (expected {source.meta})")
            return got[1]
        return _broadcast_bytes(self._store, source)


def _start_unblocker(store: CopyStore) -> Unblocker | None:
    """The watcher that shuts the group's links down on the agent's word; None where it
    cannot run (no FIFO, no ``/proc``): such a worker is kept only after non-silent losses."""
    if store.directory is None:
        return None
    try:
        return Unblocker(store.directory, store.local_rank)
    except OSError as exc:
        log.warning("in place without unblocking (a silent loss restarts the workers): %s", exc)
        return None


def _leave_group() -> None:
    """Destroy this rank's process group so that its connections close now.

    A survivor blocked in a collective with *us* (we are its ring neighbour;
    only we saw the dead peer's error) errors out only when our sockets close,
    and gloo closes them when the group object is freed: its ``abort`` does not
    (measured, torch 2.13). So the caller must drop what holds the group first
    (the DDP wrapper, the failed step's loss and its autograd graph), and the
    collection here frees the cycles among them. NCCL needs ``abort`` (its
    kernels never finish otherwise), which is called for it.
    """
    if not dist.is_initialized():
        return
    if dist.get_backend() == "nccl":
        try:
            c10d._abort_process_group()
        except (RuntimeError, ValueError) as exc:
            log.warning("NCCL process group abort failed (destroying it only): %s", exc)
    if dist.is_initialized():
        dist.destroy_process_group()
    # The fork server's bootstrap keeps every group alive until exit (zygote.
    # keep_process_groups); this one must go now, so the worker lets it go.
    kept = getattr(c10d, tfenv.KEPT_GROUPS_ATTR, None)
    if isinstance(kept, list):
        kept.clear()
    gc.collect()


def _broadcast_bytes(store: CopyStore, source: Source) -> bytes:
    """The source rank's copy, sent to every rank (a length, then the bytes)."""
    device = _collective_device()
    if _rank() == source.rank:
        got = store.read()
        if got is None or got[0].key != source.meta.key:
            raise RuntimeError(f"state copy changed during restore (expected {source.meta})")
        data = got[1]
        size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    else:
        data = b""
        size = torch.zeros(1, dtype=torch.int64, device=device)
    dist.broadcast(size, src=source.rank)
    if _rank() == source.rank:
        buf = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
        dist.broadcast(buf, src=source.rank)
        return data
    received = bytearray(int(size.item()))
    host = torch.frombuffer(received, dtype=torch.uint8) if received else torch.empty(0)
    buf = (
        host
        if device.type == "cpu"
        else torch.empty(len(received), dtype=torch.uint8, device=device)
    )
    dist.broadcast(buf, src=source.rank)
    if buf is not host:
        host.copy_(buf.cpu())
    return bytes(received)


def _all_gather_pickled(obj: CopyMeta | None) -> list[CopyMeta | None]:
    """Every rank's copy header, gathered without numpy (``peer.collectives.all_gather_json``:
    the agent image has none, and ``dist.all_gather_object`` decodes through it)."""
    rows = all_gather_json(
        None if obj is None else dataclasses.asdict(obj), device=_collective_device()
    )
    return [None if fields is None else CopyMeta(**fields) for fields in rows]


def _collective_device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
