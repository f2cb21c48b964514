"""The goodput benchmark's chaos schedule: seeded, the same for every launcher, and bounded."""

from __future__ import annotations

import pytest

from benchmarks._chaos import FREEZE, KILL, REPLACE, ChaosEvent, chaos_schedule


def test_same_arguments_same_schedule_and_seeds_differ() -> None:
    one = chaos_schedule(7, 180, 30, 15, 4, protected=frozenset({0}))
    assert one == chaos_schedule(7, 180, 30, 15, 4, protected=frozenset({0}))
    others = {tuple(chaos_schedule(s, 180, 30, 15, 4, protected=frozenset({0}))) for s in range(8)}
    assert len(others) > 1


def test_a_fault_every_n_seconds_and_a_replacement_m_seconds_later() -> None:
    events = chaos_schedule(1, 105, 30, 10, 4, protected=frozenset({0}))
    faults = [e for e in events if e.action != REPLACE]
    replaced = [e for e in events if e.action == REPLACE]
    assert [e.time for e in faults] == [30, 60, 90]
    assert all(e.action in (KILL, FREEZE) and e.node in (1, 2, 3) for e in faults)
    assert [(e.time, e.node) for e in replaced] == [(f.time + 10, f.node) for f in faults]


def _events(*rows: tuple[float, str, int]) -> list[ChaosEvent]:
    return [ChaosEvent(t, action, node) for t, action, node in rows]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        # The quick run's shape: two slots, slot 0 protected: every fault hits slot 1.
        ((0, 6, 2, 1, 2, (KILL,), 1),
         _events((2, KILL, 1), (3, REPLACE, 1), (4, KILL, 1), (5, REPLACE, 1))),
        # The full run's shape (seed 0): pinned, so a change of the draw shows here.
        ((0, 180, 30, 15, 4, (KILL, FREEZE), 2),
         _events((30, FREEZE, 2), (45, REPLACE, 2), (60, KILL, 2), (75, REPLACE, 2),
                 (90, FREEZE, 2), (105, REPLACE, 2), (120, FREEZE, 2), (135, REPLACE, 2),
                 (150, FREEZE, 3), (165, REPLACE, 3))),
    ],
)  # fmt: skip
def test_pinned_schedules(
    args: tuple[int, float, float, float, int, tuple[str, ...], int], expected: list[ChaosEvent]
) -> None:
    seed, duration, every, down, nodes, actions, min_up = args
    got = chaos_schedule(seed, duration, every, down, nodes, actions=actions,
                         protected=frozenset({0}), min_up=min_up)  # fmt: skip
    assert got == expected


def test_replacement_past_the_window_is_dropped_and_the_slot_stays_down() -> None:
    events = chaos_schedule(3, 50, 20, 15, 2, protected=frozenset({0}))
    # Fault at 20 on slot 1, back at 35; fault at 40 on slot 1 again, back at 55 > 50.
    assert [(e.time, e.action == REPLACE, e.node) for e in events] == [
        (20, False, 1), (35, True, 1), (40, False, 1),
    ]  # fmt: skip


def test_overlapping_downtimes_pick_only_nodes_that_are_up_and_keep_min_up() -> None:
    # Down 25 s, a fault every 10 s: several slots are down at once.
    events = chaos_schedule(5, 100, 10, 25, 4, min_up=2)
    down: set[int] = set()
    for e in events:
        if e.action == REPLACE:
            down.remove(e.node)
        else:
            assert e.node not in down
            down.add(e.node)
            assert 4 - len(down) >= 2
    # With at most two slots down and a fault due every 10 s, some ticks are skipped.
    assert len([e for e in events if e.action != REPLACE]) < 9


def test_replacement_at_the_same_time_as_the_next_fault_comes_first() -> None:
    events = chaos_schedule(2, 35, 10, 10, 2, protected=frozenset({0}))
    assert [(e.time, e.action == REPLACE) for e in events] == [
        (10, False), (20, True), (20, False), (30, True), (30, False),
    ]  # fmt: skip


def test_every_slot_protected_means_no_events() -> None:
    assert chaos_schedule(1, 100, 10, 5, 2, protected=frozenset({0, 1})) == []


@pytest.mark.parametrize(
    "kwargs",
    [
        {"every": 0},
        {"down": -1},
        {"duration": 0},
        {"nodes": 0},
        {"actions": ()},
        {"actions": ("reboot",)},
    ],
)
def test_bad_arguments_raise(kwargs: dict[str, object]) -> None:
    args: dict[str, object] = {"seed": 1, "duration": 60, "every": 10, "down": 5, "nodes": 4}
    args.update(kwargs)
    with pytest.raises(ValueError):
        chaos_schedule(**args)  # type: ignore[arg-type]
