"""Table tests of the rendezvous's pure decisions (``rdzv_logic``)."""

from __future__ import annotations

import pytest

from torchflex_agent.errors import StoreProtocolError
from torchflex_agent.rendezvous.logic import (
    ArrivalRole,
    NodeDescriptor,
    ProgressTracker,
    RendezvousResult,
    RendezvousSettings,
    StaleMark,
    Standing,
    arrival_role,
    close_decision,
    decode_membership,
    encode_membership,
    standing,
    successor,
    waiter_marks_stale,
)
from torchflex_contract.progress import RestartReason

S = RendezvousSettings(min_nodes=2, max_nodes=4, last_call=1.0, join_timeout=60)


@pytest.mark.parametrize(
    ("now", "arrivals", "min_reached_at", "expected"),
    [
        (10.0, 1, None, (False, 5.0, None)),  # below min: fallback wait, no timer
        (10.0, 2, None, (False, 1.0, 10.0)),  # min just reached: last call starts now
        (10.4, 2, 10.0, (False, 0.6, 10.0)),  # inside the window
        (11.0, 3, 10.0, (True, 0.0, 10.0)),  # window over: close
        (10.1, 4, 10.0, (True, 0.0, 10.0)),  # max: close at once
        (10.1, 4, None, (True, 0.0, 10.1)),
        (10.1, 6, None, (True, 0.0, 10.1)),  # over max (late adds) still closes
    ],
)
def test_close_decision(
    now: float,
    arrivals: int,
    min_reached_at: float | None,
    expected: tuple[bool, float, float | None],
) -> None:
    close, wait, reached = expected
    d = close_decision(
        now=now, arrivals=arrivals, settings=S, min_reached_at=min_reached_at, fallback_wait=5.0
    )
    assert d.close is close
    assert d.wait == pytest.approx(wait)
    assert d.min_reached_at == reached


@pytest.mark.parametrize(
    ("index", "max_nodes", "role"),
    [(0, 1, ArrivalRole.CLOSER), (2, 3, ArrivalRole.CLOSER), (0, 3, ArrivalRole.CANDIDATE),
     (3, 3, ArrivalRole.CANDIDATE)],
)  # fmt: skip
def test_arrival_role(index: int, max_nodes: int, role: ArrivalRole) -> None:
    assert arrival_role(index, max_nodes) is role


@pytest.mark.parametrize(
    ("index", "closed", "expected"),
    [(0, 1, Standing.MEMBER), (2, 3, Standing.MEMBER), (3, 3, Standing.WAITER),
     (0, 0, Standing.WAITER)],
)  # fmt: skip
def test_standing(index: int, closed: int, expected: Standing) -> None:
    assert standing(index, closed) is expected


@pytest.mark.parametrize(("closed", "max_nodes", "marks"), [(2, 4, True), (4, 4, False)])
def test_waiter_marks_stale_only_with_room(closed: int, max_nodes: int, marks: bool) -> None:
    assert waiter_marks_stale(closed, max_nodes) is marks


@pytest.mark.parametrize(
    ("rank", "n", "succ"), [(0, 1, None), (0, 2, 1), (1, 2, 0), (2, 3, 0), (0, 3, 1)]
)
def test_ring_successor(rank: int, n: int, succ: int | None) -> None:
    assert successor(rank, n) == succ


def test_settings_reject_min_above_max() -> None:
    with pytest.raises(ValueError, match="min"):
        RendezvousSettings(3, 2, 1.0, 1.0)


@pytest.mark.parametrize(
    ("readings", "lost_at"),
    [
        ([(None, 0.0), (None, 1.0), (None, 1.5)], 2),  # never heartbeated
        ([(1, 0.0), (2, 1.0), (2, 2.0), (2, 2.6)], 3),  # stalled after 2
        ([(1, 0.0), (2, 1.4), (3, 2.8), (4, 4.2)], None),  # slow but moving
        ([(5, 0.0), (5, 1.49)], None),  # just under the timeout
    ],
)
def test_progress_tracker(readings: list[tuple[int | None, float]], lost_at: int | None) -> None:
    tracker = ProgressTracker(timeout=1.5)
    verdicts = [tracker.observe(v, t) for v, t in readings]
    expected = [lost_at is not None and i >= lost_at for i in range(len(readings))]
    assert verdicts == expected


def nodes(*nprocs: int) -> tuple[NodeDescriptor, ...]:
    return tuple(NodeDescriptor(f"n{i}", f"10.0.0.{i}", 29500 + i, p) for i, p in enumerate(nprocs))


@pytest.mark.parametrize(
    ("nprocs", "node_rank", "world", "offset"),
    [((1,), 0, 1, 0), ((2, 2, 2), 1, 6, 2), ((4, 1, 2), 2, 7, 5)],
)
def test_result_ranks(nprocs: tuple[int, ...], node_rank: int, world: int, offset: int) -> None:
    r = RendezvousResult(round=3, node_rank=node_rank, nodes=nodes(*nprocs))
    assert (r.world_size, r.rank_offset, r.num_nodes) == (world, offset, len(nprocs))
    assert r.master.addr == "10.0.0.0" and r.master.port == 29500
    assert r.me.node_id == f"n{node_rank}"


def test_membership_round_trip_and_malformed() -> None:
    assert decode_membership(encode_membership(nodes(1, 2), "me")) == nodes(1, 2)
    for bad in (b"not json", b'{"nodes": [{"node_id": "x"}]}', b"[]"):
        with pytest.raises(StoreProtocolError):
            decode_membership(bad)


def test_stale_mark_round_trip_and_malformed() -> None:
    mark = StaleMark(RestartReason.MEMBER_LOST, "n1", "rank 2 silent")
    assert StaleMark.decode(mark.encode()) == mark
    with pytest.raises(StoreProtocolError):
        StaleMark.decode(b'{"reason": "Nope", "by": "x"}')
