"""Hang detection's pure parts and the pulse record (issue 28), in tables.

The rule (``loop.logic.stall``): when a job counts as hung on a member's own
clock, the timeout in force, which rank stopped it; the pulse
(``torchflex_agent.pulse``): a worker's record written and read back; the
``--hang-timeout`` flag's range.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from torchflex_agent import pulse
from torchflex_agent.errors import ConfigError
from torchflex_agent.loop.logic import preflight, stall
from torchflex_agent.loop.logic.config import parse_args
from torchflex_agent.rendezvous import logic as rdzv_logic
from torchflex_agent.rendezvous.logic import NodeDescriptor
from torchflex_agent.rendezvous.node_check import NodeCheckRecords, Pairing
from torchflex_agent.stores.kvstore import MemoryStore
from torchflex_contract.progress import MAX_STALL_RANKS, RankStall
from torchflex_contract.store_keys import Keys

BASE = ["--rdzv-id", "j", "--rdzv-endpoint", "h:1", "--", "python", "train.py"]


@pytest.mark.parametrize(
    ("explicit", "step_s", "expected"),
    [
        (None, None, stall.DERIVED_MAX_S),  # no steps seen yet
        (None, 0.5, stall.MIN_DERIVED_S),  # 10 x 0.5 s is below the floor
        (None, 12.0, 120.0),
        (None, 3600.0, stall.DERIVED_MAX_S),  # the ceiling
        (30.0, 0.5, 30.0),  # explicit wins over derived
        (0.0, 0.5, None),  # off
    ],
)
def test_timeout_in_force(
    explicit: float | None, step_s: float | None, expected: float | None
) -> None:
    assert stall.timeout(explicit, step_s) == expected


def test_step_seconds_needs_a_few_steps_after_the_first() -> None:
    assert stall.step_seconds(0.0, 0.0, 0) is None
    assert stall.step_seconds(10.0, 12.0, 3) is None  # two steps after the first: not yet
    assert stall.step_seconds(10.0, 16.0, 4) == 2.0


def test_a_job_whose_counter_stops_is_hung_after_the_timeout_on_our_clock() -> None:
    clock = stall.StallClock.start(100.0)
    clock = clock.observe(101.0, 1, 20.0)  # progress
    clock = clock.observe(105.0, 3, 20.0)  # more progress
    for t in (110.0, 115.0, 120.0):
        clock = clock.observe(t, 3, 20.0)
    assert not clock.stalled(124.9, 20.0)
    clock = clock.observe(125.0, 3, 20.0)
    assert clock.stalled(125.0, 20.0) and clock.idle(125.0) == 20.0
    assert not clock.stalled(125.0, None)  # detection off


def test_before_any_progress_the_bound_is_the_startup_one() -> None:
    clock = stall.StallClock.start(0.0)
    for t in range(5, 1800, 5):
        clock = clock.observe(float(t), None, 20.0)
    assert not clock.stalled(1795.0, 20.0)
    clock = clock.observe(1800.0, None, 20.0)
    assert clock.stalled(1800.0, 20.0)


def test_a_gap_in_our_own_watching_restarts_the_wait() -> None:
    """A frozen or starved agent wakes with a clock far ahead: that is not a hang."""
    clock = stall.StallClock.start(0.0).observe(1.0, 4, 20.0)
    clock = clock.observe(500.0, 4, 20.0)  # 499 s since our last look
    assert not clock.stalled(500.0, 20.0)
    assert clock.stalled(520.0, 20.0)


def test_progress_seen_first_as_a_nonzero_counter_counts_as_moved() -> None:
    clock = stall.StallClock.start(0.0).observe(1.0, 7, 20.0)
    assert clock.moved and clock.changed_at == 1.0


def rs(rank: int, steps: int, idle: float, waiting: bool) -> RankStall:
    return RankStall(rank=rank, pod=f"p{rank}", steps=steps, idle=idle, waiting=waiting)


@pytest.mark.parametrize(
    ("entries", "culprit"),
    [
        ([], None),
        ([rs(0, 40, 12, True), rs(1, 39, 14, False), rs(2, 40, 12, True)], 1),
        # Everyone waits (a wedged collective): the fewest steps, then the longest idle.
        ([rs(0, 40, 12, True), rs(1, 40, 15, True), rs(2, 41, 30, True)], 1),
        # Two not waiting: the one with fewer steps.
        ([rs(0, 9, 20, False), rs(1, 10, 25, False), rs(2, 10, 20, True)], 0),
    ],
)
def test_culprit(entries: list[RankStall], culprit: int | None) -> None:
    got = stall.culprit(entries)
    assert (got.rank if got is not None else None) == culprit


def test_ordered_puts_the_culprit_first_and_is_bounded() -> None:
    entries = [rs(i, 10, 1, True) for i in range(12)]
    first = entries[5]
    got = stall.ordered(entries, first)
    assert got[0] is first and [e.rank for e in got[1:4]] == [0, 1, 2]
    assert len(got) == MAX_STALL_RANKS


DUMP = """Thread 0x00007f01 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f00 (most recent call first):
  File "/venv/torch/autograd/graph.py", line 824 in _engine_run_backward
  File "/venv/torch/_tensor.py", line 625 in backward
  File "train.py", line 40 in main
  File "train.py", line 50 in <module>
  File "<frozen runpy>", line 88 in _run_code
"""


def test_main_thread_and_waiting() -> None:
    main = stall.main_thread(DUMP)
    assert main.startswith("Current thread") and "threading.py" not in main
    assert stall.waiting_on_peers(main)
    stuck = (
        "Thread 0x1 (most recent call first):\n"
        '  File "train.py", line 9 in stuck\n'
        '  File "train.py", line 20 in <module>\n'
    )
    assert not stall.waiting_on_peers(stall.main_thread(stuck))
    assert stall.main_thread("no thread blocks") == "no thread blocks"


def test_pulse_record_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "pulse.bin"
    assert pulse.read_pulse(path) is None
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    now = [100.0]
    writer = pulse.PulseWriter(fd, clock=lambda: now[0])
    try:
        writer.step()
        now[0] = 101.0
        inner, outer = object(), object()
        writer.forward_begins(outer)
        writer.forward_begins(inner)  # nested: only the outermost is timed
        now[0] = 101.5
        writer.forward_ends(inner)
        writer.forward_ends(outer)
        writer.pause(60.0)
        got = pulse.read_pulse(path)
        assert got is not None
        assert (got.steps, got.first_step, got.last_step, got.forwards) == (1, 100.0, 100.0, 1)
        assert got.forward_total == 0.5 and got.last_activity == 101.5
        assert got.paused_until == 161.5
        writer.resume()
        again = pulse.read_pulse(path)
        assert again is not None and again.paused_until == 0.0
    finally:
        os.close(fd)


def test_paused_without_an_agent_does_nothing_and_checks_its_bound() -> None:
    with pulse.paused("evaluation"):
        pass
    with pytest.raises(ValueError, match="max_seconds"), pulse.paused("x", max_seconds=0):
        pass


@pytest.mark.parametrize(
    ("value", "expected"),
    [("auto", None), ("AUTO", None), ("0", 0.0), ("10", 10.0), ("86400", 86400.0)],
)
def test_hang_timeout_flag(value: str, expected: float | None) -> None:
    assert parse_args(["--hang-timeout", value, *BASE], env={}).hang_timeout == expected
    assert parse_args(BASE, env={"TORCHFLEX_HANG_TIMEOUT": value}).hang_timeout == expected


@pytest.mark.parametrize("value", ["-1", "5", "9.9", "86401", "soon", "nan"])
def test_bad_hang_timeout_names_the_flag(value: str) -> None:
    with pytest.raises(ConfigError, match="--hang-timeout"):
        parse_args(["--hang-timeout", value, *BASE], env={})


def fig(gflops: float, correct: bool = True, device: str = "cpu") -> preflight.DeviceFigure:
    return preflight.DeviceFigure(device, gflops, correct)


@pytest.mark.parametrize(
    ("figures", "peers", "ok", "said"),
    [
        ([fig(10.0)], [], True, "no peer to compare with yet"),
        ([fig(10.0)], [12.0, 9.0], True, "against a median of 10.5 over 2 peer(s)"),
        ([fig(5.1)], [10.0], True, "against a median"),  # just under 2x slower: passes
        ([fig(4.9)], [10.0, 10.0, 11.0], False, "too slow"),
        ([fig(20.0, device="cuda:0"), fig(4.0, device="cuda:1")], [10.0], False, "too slow"),
        ([fig(50.0, correct=False, device="cuda:1")], [], False, "cuda:1 computed a wrong"),
    ],
)
def test_node_check_verdict(
    figures: list[preflight.DeviceFigure], peers: list[float], ok: bool, said: str
) -> None:
    got = preflight.verdict(figures, peers)
    assert got.ok is ok and said in got.reason, got
    assert got.gflops == min(f.gflops for f in figures)


@pytest.mark.parametrize("text", ["", "[]", "{}", '[{"device": "cpu"}]', "nope"])
def test_node_check_output_must_be_figures(text: str) -> None:
    with pytest.raises((ValueError, KeyError, TypeError)):
        preflight.parse_figures(text)


def test_node_check_flag() -> None:
    assert parse_args(BASE, env={}).node_check is False
    assert parse_args(["--node-check", "on", *BASE], env={}).node_check is True
    assert parse_args(BASE, env={"TORCHFLEX_NODE_CHECK": "on"}).node_check is True
    with pytest.raises(ConfigError, match="--node-check"):
        parse_args(["--node-check", "yes", *BASE], env={})


def link(gbps: float, correct: bool = True, error: str = "") -> preflight.LinkFigure:
    return preflight.LinkFigure(gbps, correct, error)


@pytest.mark.parametrize(
    ("got", "peers", "ok", "said"),
    [
        (None, [], True, "no peer checking at the same time"),
        (None, [1.0], True, "no peer checking at the same time"),
        (link(1.0), [], True, "all_reduce with pod-1: 1.000 GB/s bus bandwidth (no peer"),
        (link(1.0), [1.2, 0.9], True, "against a median of 1.050 over 2 node(s)"),
        (link(0.51), [1.0], True, "against a median"),  # just under 2x slower: passes
        (link(0.49), [1.0, 1.0, 1.1], False, "too slow: all_reduce with pod-1: 0.490"),
        (
            link(5.0, correct=False),
            [],
            False,
            "all_reduce with pod-1: 5.000 GB/s bus bandwidth, wrong",
        ),
        (link(0.0, False, "DistNetworkError: timed out"), [1.0], False, "with pod-1 failed: Dist"),
    ],
)
def test_node_check_link_verdict(
    got: preflight.LinkFigure | None, peers: list[float], ok: bool, said: str
) -> None:
    verdict = preflight.link_verdict(got, "pod-1", peers)
    assert verdict.ok is ok and said in verdict.reason, verdict
    assert verdict.gbps == (None if got is None or got.error else got.gbps)


@pytest.mark.parametrize("text", ["", "[]", "{}", '{"correct": true}', "nope"])
def test_node_check_link_output_must_be_figures(text: str) -> None:
    with pytest.raises((ValueError, KeyError, TypeError)):
        preflight.parse_link(text)


def test_node_check_link_output_parses() -> None:
    assert preflight.parse_link('{"gbps": 2.5, "correct": true, "error": ""}') == link(2.5)
    got = preflight.parse_link('{"gbps": 0, "correct": false, "error": "boom"}')
    assert got == link(0.0, False, "boom")


OFFER = rdzv_logic.CheckOffer("n-a", "pod-a", "127.0.0.1", 4000, until=100.0)


@pytest.mark.parametrize(
    ("raw", "me", "now", "open_"),
    [
        (None, "n-b", 50.0, False),
        (OFFER.encode(), "n-b", 50.0, True),
        (OFFER.encode(), "n-a", 50.0, False),  # our own offer
        (OFFER.encode(), "n-b", 100.0, False),  # past its wait: its agent gave up or died
        (rdzv_logic.encode_claim(OFFER, "n-b", "pod-b"), "n-c", 50.0, False),
        (b'{"withdrawn": "n-a"}', "n-b", 50.0, False),
        (b"garbage", "n-b", 50.0, False),
    ],
)
def test_node_check_lobby_offer(raw: bytes | None, me: str, now: float, open_: bool) -> None:
    assert (rdzv_logic.open_offer(raw, me, now) == OFFER) is open_


def test_node_check_claim_names_the_claimer_to_its_host_only() -> None:
    claim = rdzv_logic.encode_claim(OFFER, "n-b", "pod-b")
    assert rdzv_logic.claimed_by(claim, "n-a") == "pod-b"
    assert rdzv_logic.claimed_by(claim, "n-c") is None
    assert rdzv_logic.claimed_by(OFFER.encode(), "n-a") is None
    assert rdzv_logic.claimed_by(None, "n-a") is None


def records(store: MemoryStore, name: str) -> NodeCheckRecords:
    node = NodeDescriptor(f"n-{name}", "127.0.0.1", 0, 1, pod=f"pod-{name}")
    return NodeCheckRecords(store, Keys("j"), node)


def test_node_check_pairs_two_nodes_checking_together_and_not_a_third() -> None:
    """Three nodes in the lobby over one store: the first two pair (one hosts, one
    connects to its port), the third waits out its wait alone and withdraws."""
    store = MemoryStore()
    got: dict[str, Pairing | None] = {}

    def check(name: str, port: int, wait_s: float) -> None:
        got[name] = records(store.clone(), name).pair(port, wait_s, wait_s)

    first = threading.Thread(target=check, args=("a", 4001, 5.0))
    first.start()
    assert store.wait([Keys("j").key("node-check", "lobby")], 5.0)  # a waits there first
    check("b", 4002, 5.0)
    first.join()
    assert got["a"] == Pairing(0, "127.0.0.1", 4001, "pod-b"), got
    assert got["b"] == Pairing(1, "127.0.0.1", 4001, "pod-a"), got
    check("c", 4003, 0.3)
    assert got["c"] is None
    check("d", 4004, 0.3)  # c withdrew: d does not claim a node that left
    assert got["d"] is None


def test_node_check_figures_round_trip() -> None:
    store = MemoryStore()
    records(store, "a").publish(10.0, None)
    records(store, "b").publish(12.0, 1.5)
    store.set(Keys("j").key("node-check", 2), b"garbage")
    store.take_ticket(Keys("j").key("node-check", "count"))
    figures = records(store, "c").figures()
    assert (figures.gflops, figures.gbps) == ([10.0, 12.0], [1.5])


def test_node_check_waits_longer_for_a_peer_while_others_are_still_checking() -> None:
    """A node alone in the lobby waits its short wait; while another node has begun its
    check and not ended it (its compute half still running), up to the longer bound."""
    store = MemoryStore()
    other, me = records(store, "a"), records(store, "b")
    me.begin()
    t0 = time.monotonic()
    assert me.pair(4001, 0.2, 1.0) is None
    assert time.monotonic() - t0 < 0.8
    other.begin()
    t0 = time.monotonic()
    assert me.pair(4001, 0.2, 1.0) is None
    assert time.monotonic() - t0 >= 0.9
    other.end()
    t0 = time.monotonic()
    assert me.pair(4001, 0.2, 1.0) is None
    assert time.monotonic() - t0 < 0.8
