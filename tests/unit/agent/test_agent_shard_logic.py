"""Which holder serves which shard of sharded state after a re-form (``shard_logic``).

Pure tables (issue 18, part 2): each row is what every rank of the new round
holds (its own copy and the one before, its ring predecessor's copy and the
one before), and the plan every rank computes from it: the key, and for each
new rank r the holder of shard r. The bytes moving between real ranks are
``tests/integration/agent/test_state_peer_ranks.py``.
"""

from __future__ import annotations

import pytest

from torchflex_agent.memstate.logic.copies import CopyMeta
from torchflex_agent.memstate.logic.shards import (
    OWN,
    OWN_PREVIOUS,
    PEER,
    PEER_PREVIOUS,
    Held,
    plan_shards,
    ring_neighbours,
    ring_order,
)


def own(
    shard: int, step: int, round_no: int = 2, world: int = 3, inc: str = "A", *, base: int = -1
) -> Held:
    return Held(OWN, CopyMeta(inc, round_no, step, shard, world, base))


def prev(shard: int, step: int, round_no: int = 2, world: int = 3) -> Held:
    return Held(OWN_PREVIOUS, CopyMeta("A", round_no, step, shard, world))


def peer(shard: int, step: int, round_no: int = 2, world: int = 3, base: int = -1) -> Held:
    return Held(PEER, CopyMeta("A", round_no, step, shard, world, base))


def peer_prev(shard: int, step: int, round_no: int = 2, world: int = 3) -> Held:
    return Held(PEER_PREVIOUS, CopyMeta("A", round_no, step, shard, world))


# (what each new rank holds, the step resumed, per new rank (holder, slot))
CASES = [
    pytest.param(
        # Nobody moved: each rank loads its own shard, nothing is sent.
        [[own(0, 9), peer(2, 9)], [own(1, 9), peer(0, 9)], [own(2, 9), peer(1, 9)]],
        9, [(0, OWN), (1, OWN), (2, OWN)],
        id="same-ranks",
    ),
    pytest.param(
        # Rank 1 was lost and replaced (it holds nothing): its shard is the peer copy
        # its successor (rank 2) kept.
        [[own(0, 9), peer(2, 9)], [], [own(2, 9), peer(1, 9)]],
        9, [(0, OWN), (2, PEER), (2, OWN)],
        id="replacement-from-peer",
    ),
    pytest.param(
        # Survivors changed ranks (old 0 and 2 are now 1 and 0; the replacement is 2):
        # every rank gets its new shard from whoever holds it.
        [[own(2, 9), peer(1, 9)], [own(0, 9), peer(2, 9)], []],
        9, [(1, OWN), (0, PEER), (0, OWN)],
        id="ranks-changed",
    ),
    pytest.param(
        # The lost member died after its own commit of step 10 and before its copy
        # reached its peer: step 10 is not whole; step 9 is (the survivors' previous
        # copies, its peer's copy of step 9). Never a mix of 9 and 10.
        [[own(0, 10), prev(0, 9), peer(2, 10)], [], [own(2, 10), prev(2, 9), peer(1, 9)]],
        9, [(0, OWN_PREVIOUS), (2, PEER), (2, OWN_PREVIOUS)],
        id="newest-step-not-whole",
    ),
    pytest.param(
        # One survivor is a step ahead and the lost member's step 10 reached its peer,
        # but the other survivor never committed 10: only 9 is whole (two slots back).
        [[own(0, 9), prev(0, 8), peer(2, 9)], [],
         [own(2, 10), prev(2, 9), peer(1, 10), peer_prev(1, 9)]],
        9, [(0, OWN), (2, PEER_PREVIOUS), (2, OWN_PREVIOUS)],
        id="one-survivor-ahead",
    ),
    pytest.param(
        # A member frozen in round 1 woke up holding step 50 of round 1; the group
        # trained on in round 2. Round first: its copies are never used.
        [[own(0, 9), peer(2, 9)], [own(1, 50, round_no=1), peer(0, 50, round_no=1)],
         [own(2, 9), peer(1, 9)]],
        9, [(0, OWN), (2, PEER), (2, OWN)],
        id="stale-round-ignored",
    ),
    pytest.param(
        # Round 3 re-committed step 9 of round 2 (base 2), but the replacement's
        # re-commit never reached its peer before it died too: round 3 has no whole
        # key; round 2's step 9 is the same state and whole (re-commits count for it).
        [[own(0, 9, round_no=3, base=2), prev(0, 9), peer(2, 9, round_no=3, base=2)], [],
         [own(2, 9, round_no=3, base=2), prev(2, 9), peer(1, 9)]],
        9, [(0, OWN), (2, PEER), (2, OWN)],
        id="recommit-not-whole-base-round-is",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("held", "step", "sources"), CASES)
def test_plan_shards(held: list[list[Held]], step: int, sources: list[tuple[int, str]]) -> None:
    plan = plan_shards(held, "A")
    assert plan is not None
    assert plan.meta.step == step and plan.meta.world == len(held)
    assert [(s.holder, s.slot) for s in plan.sources] == sources
    assert [s.shard for s in plan.sources] == list(range(len(held)))
    for rank in range(len(held)):
        # Every shard a rank sends goes to the rank of that number, never to itself.
        assert all(s.holder == rank != s.shard for s in plan.sends(rank))


NONE_CASES = [
    pytest.param([[], [], []], "A", id="nobody-holds-anything"),
    pytest.param(
        # Two members lost at once, neighbours in the ring: shard 1 died with its
        # owner and with its peer (old rank 2). Never a mix: the disk checkpoint.
        [[own(0, 9), peer(2, 9)], [], []], "A",
        id="shard-lost-with-its-peer",
    ),
    pytest.param(
        # The group shrank from 3 to 2: the shards of 3 do not map onto 2 ranks.
        [[own(0, 9), peer(2, 9)], [own(2, 9), peer(1, 9)]], "A",
        id="size-shrank",
    ),
    pytest.param(
        # ...or grew: a resharding load is the script's (disk checkpoint).
        [[own(0, 9, world=2), peer(1, 9, world=2)], [own(1, 9, world=2), peer(0, 9, world=2)], []],
        "A",
        id="size-grew",
    ),
    pytest.param(
        # The newest round is not whole (the only member that committed in round 3
        # holds its own shard): older rounds are not a fallback, never stale state.
        [[own(0, 20, round_no=3), prev(0, 9)], [own(1, 9), peer(0, 9)], [own(2, 9), peer(1, 9)]],
        "A",
        id="newest-round-not-whole",
    ),
    pytest.param(
        # The same with re-commits of round 2, but round 2 is not whole either.
        [[own(0, 9, round_no=3, base=2)], [], [own(2, 9, round_no=3, base=2), peer(1, 8)]],
        "A",
        id="recommit-base-round-not-whole-either",
    ),
    pytest.param(
        # Two old store numberings that cannot be ordered: nothing usable.
        [[own(0, 9, inc="X")], [own(1, 9, inc="Y")]], "NEW",
        id="incarnations-mix",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("held", "current"), NONE_CASES)
def test_no_whole_key(held: list[list[Held]], current: str) -> None:
    assert plan_shards(held, current) is None


# (each rank's node, the ring's order): a rank's successor is the next one in it.
RINGS = [
    pytest.param([None, None, None], [0, 1, 2], id="no-nodes-rank-order"),
    pytest.param([0, 1, 2], [0, 1, 2], id="one-rank-per-node"),
    pytest.param([0, 0, 1, 1], [0, 2, 1, 3], id="2-nodes-x-2"),
    pytest.param([0, 0, 0, 1, 1, 1], [0, 3, 1, 4, 2, 5], id="2-nodes-x-3"),
    pytest.param([0, 0, 1, 1, 2, 2], [0, 2, 4, 1, 3, 5], id="3-nodes-x-2"),
    # Nodes of different sizes: still one cycle through every rank; the bigger
    # node's extra ranks follow each other (no other node is left to take them).
    pytest.param([0, 0, 0, 1], [0, 3, 1, 2], id="uneven-3-and-1"),
    pytest.param([0, 0, 1, 1, 1], [0, 2, 1, 3, 4], id="uneven-2-and-3"),
    pytest.param([5, 5, 2, 2], [0, 2, 1, 3], id="node-ranks-not-from-0"),
    pytest.param([0], [0], id="alone"),
]  # fmt: skip


@pytest.mark.parametrize(("nodes", "order"), RINGS)
def test_ring_order(nodes: list[int | None], order: list[int]) -> None:
    assert ring_order(nodes) == order
    succ = [ring_neighbours(nodes, r)[0] for r in range(len(nodes))]
    pred = [ring_neighbours(nodes, r)[1] for r in range(len(nodes))]
    # A permutation: each rank keeps exactly one copy, and its predecessor's is the one.
    assert sorted(succ) == list(range(len(nodes)))
    assert all(succ[p] == r for r, p in enumerate(pred))
    nodes_seen = {n for n in nodes if n is not None}
    sizes = {nodes.count(n) for n in nodes_seen}
    if len(nodes_seen) > 1 and len(sizes) == 1:
        # Equal nodes, two or more: every copy is kept on another node.
        assert all(nodes[succ[r]] != nodes[r] for r in range(len(nodes)))
