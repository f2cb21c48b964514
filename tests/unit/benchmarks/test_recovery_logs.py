"""Pure parts of the recovery and preemption benchmarks: log parsing and arithmetic."""

from __future__ import annotations

import pytest

from benchmarks._proc_logs import (
    StepLine,
    first_step_at,
    group_resumed_at,
    join_phases,
    last_step_before,
    parse_step,
    parse_steps,
    pick_victim,
    ranks_of,
    recovery_seconds,
    restored_at,
    resumed_seconds,
    resumed_steps,
    steps_lost,
)


def test_parse_step_with_and_without_prefix() -> None:
    line = "[rank 1] step=12 loss=0.5000 world=3 rank=1 sps=9.8 t=1700000000.125"
    assert parse_step(line) == StepLine(12, 3, 1, 1700000000.125)
    assert parse_step(line.split("] ", 1)[1]) == StepLine(12, 3, 1, 1700000000.125)
    # Without --print-time there is no timestamp: not a timed step line.
    assert parse_step("step=12 loss=0.5 world=3 rank=1 sps=9.8") is None
    assert parse_step("checkpoint step=10") is None


def test_parse_steps_and_resumed() -> None:
    lines = [
        "[torchflex-agent] round 1 ...",
        "[rank 0] resumed from step=40",
        "[rank 0] step=41 loss=1.0 world=2 rank=0 sps=10.0 t=10.5",
        "[rank 0] step=42 loss=1.0 world=2 rank=0 sps=10.0 t=10.6",
    ]
    assert [s.step for s in parse_steps(lines)] == [41, 42]
    assert resumed_steps(lines) == [40]


def test_restored_at_reads_only_timed_restored_lines() -> None:
    lines = [
        "[rank 1] restored step=30 from=local round=2 in place t=1700000000.250",
        "[rank 1] restored step=31 from=rank 0 round=3 t=1700000001.5",
        "[rank 1] restored step=32 from=local round=4",  # no --print-time: no time
        "[rank 1] resumed from step=30",  # the disk path: not a restored line
        "[rank 1] step=33 loss=1.0 world=2 rank=1 sps=9.9 t=1700000002.0",
        "[rank 1] restored step=5 from=local slot=copy shard=1 mark=1000005 sum=3.0",
    ]
    assert restored_at(lines) == [1700000000.25, 1700000001.5]


def test_resumed_is_the_last_survivor_to_print_restored() -> None:
    a = [
        "[rank 0] restored step=0 from=local round=0 t=90.0",  # before the kill
        "[rank 0] step=30 loss=1.0 world=3 rank=0 sps=10.0 t=100.4",
        "[rank 0] restored step=30 from=local round=1 in place t=100.58",
        "[rank 0] step=31 loss=1.0 world=2 rank=0 sps=10.0 t=100.70",
        "[rank 0] restored step=40 from=local round=2 in place t=105.0",  # a later round
    ]
    b = ["[rank 1] restored step=30 from=local round=1 in place t=100.62"]
    assert resumed_seconds([a, b], 100.5) == pytest.approx(0.12)
    assert resumed_seconds([a], 100.5) == pytest.approx(0.08)


def test_resumed_none_when_a_survivor_prints_no_timed_restored() -> None:
    a = ["[rank 0] restored step=30 from=local round=1 in place t=100.58"]
    untimed = ["[rank 1] resumed from step=30", "[rank 1] restored step=30 from=local round=1"]
    assert resumed_seconds([a, untimed], 100.5) is None
    assert resumed_seconds([a, []], 100.5) is None
    assert resumed_seconds([], 100.5) is None
    assert resumed_seconds([a], 101.0) is None  # only one before the event


def _steps(*items: tuple[int, int, float]) -> list[StepLine]:
    return [StepLine(step, world, 0, t) for step, world, t in items]


def test_recovery_is_the_slowest_survivor() -> None:
    a = _steps((9, 3, 99.9), (10, 3, 100.0), (11, 2, 101.0), (12, 2, 101.1))
    b = _steps((10, 3, 100.0), (11, 2, 101.4))
    assert first_step_at(a, 100.5, 2) == StepLine(11, 2, 0, 101.0)
    assert first_step_at(a, 100.5, 3) is None
    assert group_resumed_at([a, b], 100.5, 2) == 101.4
    assert recovery_seconds([a, b], 100.5, 2) == pytest.approx(0.9)


def test_recovery_none_when_a_survivor_never_trains() -> None:
    a = _steps((11, 2, 101.0))
    assert recovery_seconds([a, []], 100.5, 2) is None
    assert recovery_seconds([], 100.5, 2) is None


def test_steps_lost_and_last_step() -> None:
    a = _steps((7, 3, 10.0), (8, 3, 10.1), (9, 2, 12.0))
    b = _steps((8, 3, 10.1))
    assert last_step_before([a, b], 10.05) == 7
    assert last_step_before([a, b], 11.0) == 8
    assert last_step_before([], 11.0) == 0
    assert steps_lost(8, 8) == 0
    assert steps_lost(18, 10) == 8
    assert steps_lost(8, 10) == 0


def test_ranks_of() -> None:
    steps = [StepLine(1, 3, 2, 1.0), StepLine(2, 2, 1, 2.0), StepLine(3, 3, 0, 3.0)]
    assert ranks_of(steps, 3) == {0, 2}


@pytest.mark.parametrize(
    ("ranks", "protected", "victim"),
    [
        ([0, 1, 2], (), 2),
        ([2, 0, 1], (), 0),
        ([2, 0, 1], (0,), 2),  # node 0 hosts torchrun's store: take the next
        ([1, 2, 0], (1,), 0),
        ([None, 2, 0], (), 1),
    ],
)
def test_pick_victim(ranks: list[int | None], protected: tuple[int, ...], victim: int) -> None:
    assert pick_victim(ranks, protected) == victim


def test_pick_victim_none_possible() -> None:
    with pytest.raises(ValueError, match="no node"):
        pick_victim([0, 1], protected=(1,))


def test_join_phases_newcomer_first_and_slowest_member_last() -> None:
    survivor_a = [
        (99.0, "[torchflex-agent] round 0 over: MemberLost; re-forming"),  # before t0
        (102.55, "[rank 0] stopping at step=30 on SIGTERM"),
        (102.60, "[torchflex-agent] round 1 over: MemberJoined; re-forming"),
        (102.61, "[torchflex-agent] round 2: ... (rendezvous took 1.0 ms, restarts 0)"),
        (102.62, "[torchflex-agent] round 2: started workers (1 forked warm), pids [7]"),
        (102.70, "[rank 0] resumed from step=30"),
    ]
    survivor_b = [
        (102.50, "[rank 1] stopping at step=30 on SIGTERM"),
        (102.65, "[torchflex-agent] round 1 over: MemberJoined; re-forming"),
        (102.66, "[torchflex-agent] round 2: ... (rendezvous took 3.0 ms, restarts 0)"),
        (102.68, "[torchflex-agent] round 2: started workers (1 forked warm), pids [8]"),
        (102.75, "[rank 1] resumed from step=30"),
        (109.00, "[rank 1] resumed from step=90"),  # after the window
    ]
    newcomer = [
        (102.40, "[torchflex-agent] worker fork server ready (preloaded in 2.35s)"),
        (102.41, "[torchflex-agent] joining the rendezvous (round >= 0)"),
        (102.66, "[torchflex-agent] round 2: ... (rendezvous took 250.0 ms, restarts 0)"),
        (102.67, "[torchflex-agent] round 2: started workers (1 forked warm), pids [9]"),
        (102.72, "[rank 2] resumed from step=30"),
        (103.00, "[torchflex-agent] joining the rendezvous (round >= 3)"),  # a later round
    ]
    phases = join_phases([survivor_a, survivor_b, newcomer], 2, 100.0, 103.5)
    assert phases == pytest.approx(
        {
            "zygote_ready": 2.40,
            "joining": 2.41,
            "survivors_stopped": 2.55,
            "rounds_over": 2.65,
            "round_formed": 2.66,
            "workers_started": 2.68,
            "workers_resumed": 2.75,
        }
    )


def test_join_phases_none_for_what_no_node_logged() -> None:
    torchrun = [(101.0, "INFO:torch.distributed.elastic: Rendezvous'ing worker group")]
    phases = join_phases([torchrun, torchrun], 1, 100.0, 110.0)
    assert set(phases) == {
        "zygote_ready", "joining", "survivors_stopped", "rounds_over", "round_formed",
        "workers_started", "workers_resumed",
    }  # fmt: skip
    assert all(v is None for v in phases.values())
