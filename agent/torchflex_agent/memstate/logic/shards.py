"""Pure decisions of the state API for sharded state: which holder serves which shard.

Where it sits: ``peer.ring`` keeps, for ``TrainState(sharded=True)``, each
rank's shard in up to four slots of its agent's folder (its own copy and the
one before it, its ring predecessor's copy and the one before it); after a
re-form every rank of the new round lists the copies it holds, the group
gathers the lists, and :func:`plan_shards` (run identically on every rank)
says which key the group resumes from and who gives rank ``r`` shard ``r``.
Table-tested in ``tests/unit/agent/test_agent_shard_logic.py``; held to the
agent's pure import-linter contract (no clock, no socket, no torch).

The rules, on top of ``memstate.logic.copies``'s fencing: only the usable incarnation
and, within it, only the newest round anyone holds (a stale member's copies
are of an older round, so they are never used), or a round that round's
re-commits came from (``restore`` commits the restored state again under
the new round, recording the round it came from: the same state); within that round the
highest step at which *every* shard has a holder (a lower step only when a
shard's newest copy died with its member before it reached its peer). A key
written by a group of another size, or no whole key in the newest round:
None, and the script falls back to its disk checkpoint (a resharding load).
Never a mix of keys.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from torchflex_agent.memstate.logic.copies import CopyMeta, usable_incarnation

OWN = "copy"
"""A rank's own newest copy (``memstate.shm.OWN``)."""
OWN_PREVIOUS = "prev"
PEER = "peer"
"""The newest copy its ring predecessor sent it."""
PEER_PREVIOUS = "peer-prev"
SLOTS = (OWN, OWN_PREVIOUS, PEER, PEER_PREVIOUS)
"""Every slot of a sharded rank, in the order a holder serves from them."""


@dataclasses.dataclass(frozen=True)
class Held:
    """One copy a rank holds: ``meta.rank`` is the shard (the writer's rank in
    ``meta.round``), ``meta.world`` the number of shards of that key."""

    slot: str
    meta: CopyMeta


@dataclasses.dataclass(frozen=True)
class ShardSource:
    """Where rank ``shard`` of the new round gets its shard."""

    shard: int
    holder: int
    """The new round's rank that holds it (the shard's rank itself when it holds it)."""
    slot: str


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """The key every rank resumes from and, per new rank, the holder of its shard."""

    meta: CopyMeta
    """The chosen key (``rank`` unset: each rank gets its own shard of it)."""
    sources: tuple[ShardSource, ...]

    def sends(self, rank: int) -> list[ShardSource]:
        """The shards ``rank`` sends (each to the rank of the same number)."""
        return [s for s in self.sources if s.holder == rank and s.shard != rank]

    def source(self, rank: int) -> ShardSource:
        return self.sources[rank]


def ring_order(nodes: Sequence[int | None]) -> list[int]:
    """The peer-copy ring over ranks (index = rank, each its node rank or None): every
    node's first rank by node, then every node's second, and so on (pure).

    Ranks of a node are contiguous (``workers.group.worker_env``), so ``r + 1`` would
    mostly be the same node, and a node's loss would take a shard with its only
    peer copy. In this order a rank's successor is on another node whenever there
    are two nodes or more and every node has as many ranks. A rank without a node
    (None: not run by ``torchflex-agent``) counts as a node of its own.
    """
    keys = [("node", n) if n is not None else ("rank", r) for r, n in enumerate(nodes)]
    seen: dict[tuple[str, int], int] = {}
    index = []
    for key in keys:
        index.append(seen.get(key, 0))
        seen[key] = index[-1] + 1
    order = {key: i for i, key in enumerate(dict.fromkeys(keys))}
    return sorted(range(len(nodes)), key=lambda r: (index[r], order[keys[r]]))


def ring_neighbours(nodes: Sequence[int | None], rank: int) -> tuple[int, int]:
    """``rank``'s successor (which keeps its copy) and predecessor (whose copy it keeps)
    in :func:`ring_order`: each rank has exactly one of each."""
    ring = ring_order(nodes)
    at = ring.index(rank)
    return ring[(at + 1) % len(ring)], ring[(at - 1) % len(ring)]


def plan_shards(held: Sequence[Sequence[Held]], current: str) -> ShardPlan | None:
    """The new round's plan (index = rank in the new round, each its list of copies);
    None when no key of the newest round is whole or the group's size changed.

    A copy ``restore`` committed again under round R+1 (``meta.base`` = R) also
    holds its key in round R: when round R+1 has no whole key (a member lost
    before every re-commit reached its peer), round R is tried, and so on down
    that chain of re-commits only (never an older round by itself).
    """
    everything = [h for copies in held for h in copies]
    incarnation = usable_incarnation([h.meta for h in everything], current)
    if incarnation is None:
        return None
    rows = [
        _with_aliases([h for h in copies if h.meta.incarnation == incarnation]) for copies in held
    ]
    usable = [h for row in rows for h in row]
    round_no: int | None = max(h.meta.round for h in usable)
    while round_no is not None:
        steps = sorted({h.meta.step for h in usable if h.meta.round == round_no}, reverse=True)
        for step in steps:
            key = (incarnation, round_no, step)
            worlds = {h.meta.world for h in usable if h.meta.key == key}
            if worlds != {len(held)}:
                # Written by a group of another size (or, corrupt, of several): its shards
                # do not map onto this group's ranks. A resharding load is the script's.
                return None
            sources = [_holder(rows, key, shard) for shard in range(len(held))]
            if all(s is not None for s in sources):
                meta = CopyMeta(incarnation, round_no, step, -1, len(held))
                return ShardPlan(meta, tuple(s for s in sources if s is not None))
        here = [h.meta for h in usable if h.meta.round == round_no]
        round_no = max((m.base for m in here if 0 <= m.base < m.round), default=None)
    return None


def _with_aliases(copies: Sequence[Held]) -> list[Held]:
    """``copies`` and, for each re-commit, the same copy under the key it re-commits
    (the holder serves the same file: ``peer.ring`` accepts either key)."""
    aliases = [
        Held(h.slot, dataclasses.replace(h.meta, round=h.meta.base, base=-1))
        for h in copies
        if 0 <= h.meta.base < h.meta.round
    ]
    return [*copies, *aliases]


def _holder(
    held: Sequence[Sequence[Held]], key: tuple[str, int, int], shard: int
) -> ShardSource | None:
    """The rank holding ``shard`` at ``key``: the shard's own rank first (nothing to
    send), then the lowest rank; within a rank, the first slot of :data:`SLOTS`."""
    order = [shard, *(r for r in range(len(held)) if r != shard)]
    for rank in order:
        for slot in SLOTS:
            for h in held[rank]:
                if h.slot == slot and h.meta.key == key and h.meta.rank == shard:
                    return ShardSource(shard, rank, slot)
    return None
