"""The goodput benchmark's accounting: job timeline, steps lost, time at each size."""

from __future__ import annotations

import pytest

from benchmarks._goodput_stats import Goodput, account, job_timeline, progress_curve, step_rate
from benchmarks._proc_logs import StepLine


def _ranks(step: int, world: int, t: float, ranks: int) -> list[StepLine]:
    """Every rank of a group printing ``step`` a few ms apart."""
    return [StepLine(step, world, r, t + r * 0.001) for r in range(ranks)]


def test_timeline_keeps_one_line_per_step_of_a_group() -> None:
    lines = [*_ranks(1, 2, 10.0, 2), *_ranks(2, 2, 10.1, 2), *_ranks(3, 2, 10.2, 2)]
    assert [(s.step, s.rank) for s in job_timeline(reversed(lines))] == [(1, 0), (2, 0), (3, 0)]


def test_timeline_keeps_the_redone_steps_after_a_restart() -> None:
    before = [*_ranks(9, 3, 10.0, 3), *_ranks(10, 3, 10.1, 3), *_ranks(11, 3, 10.2, 3)]
    # Rank 0 was killed before printing 12; the others printed it.
    before += [StepLine(12, 3, 1, 10.3), StepLine(12, 3, 2, 10.3)]
    after = [*_ranks(11, 2, 11.0, 2), *_ranks(12, 2, 11.1, 2), *_ranks(13, 2, 11.2, 2)]
    timeline = job_timeline([*after, *before])
    assert [(s.step, s.world) for s in timeline] == [
        (9, 3), (10, 3), (11, 3), (12, 3), (11, 2), (12, 2), (13, 2),
    ]  # fmt: skip


def test_timeline_resume_at_the_last_step_is_no_restart() -> None:
    lines = [*_ranks(5, 3, 1.0, 3), *_ranks(6, 2, 2.0, 2), *_ranks(7, 2, 2.1, 2)]
    assert [s.step for s in job_timeline(lines)] == [5, 6, 7]


def test_step_rate_counts_full_size_completions_in_the_window() -> None:
    timeline = [StepLine(i, 4, 0, 0.1 * i) for i in range(1, 21)]  # 10 steps/s
    assert step_rate(timeline, 0.0, 1.0, 4) == pytest.approx(10.0)
    assert step_rate(timeline, 0.0, 1.0, 3) == 0.0
    assert step_rate(timeline, 1.0, 1.0, 4) == 0.0


def _line(step: int, world: int, t: float) -> StepLine:
    return StepLine(step, world, 0, t)


@pytest.mark.parametrize(
    ("timeline", "expected"),
    [
        # No failure: 10 steps at full size, a step each 0.1 s (times in tenths to stay exact).
        ([_line(i, 4, i / 10) for i in range(1, 11)],
         Goodput(completed=10, lost=0, ideal=10.0, full_s=1.0, reduced_s=0.0, stalled_s=0.0,
                 restarts=0)),
        # A kill after step 5, a stall until 0.8 s, a restart from checkpoint 3 at world 3:
        # steps 4 and 5 are done again (2 lost); progress 8 - 2 = 6, where the counter ends.
        ([_line(1, 4, 0.1), _line(2, 4, 0.2), _line(3, 4, 0.3), _line(4, 4, 0.4),
          _line(5, 4, 0.5), _line(4, 3, 0.8), _line(5, 3, 0.9), _line(6, 3, 1.0)],
         Goodput(completed=8, lost=2, ideal=10.0, full_s=0.5, reduced_s=0.2, stalled_s=0.3,
                 restarts=1)),
        # The job never trained in the window: the whole window is stalled.
        ([], Goodput(completed=0, lost=0, ideal=10.0, full_s=0.0, reduced_s=0.0, stalled_s=1.0,
                     restarts=0)),
    ],
)  # fmt: skip
def test_account_table(timeline: list[StepLine], expected: Goodput) -> None:
    got = account(timeline, 0.0, 1.0, full_world=4, ideal_rate=10.0, stall_gap=0.25)
    assert got.completed == expected.completed
    assert got.lost == expected.lost
    assert got.restarts == expected.restarts
    assert got.ideal == pytest.approx(expected.ideal)
    assert got.full_s == pytest.approx(expected.full_s)
    assert got.reduced_s == pytest.approx(expected.reduced_s)
    assert got.stalled_s == pytest.approx(expected.stalled_s)
    assert got.full_s + got.reduced_s + got.stalled_s == pytest.approx(1.0)


def test_steps_before_the_window_set_the_counter_and_a_rewind_into_them_is_lost() -> None:
    timeline = [_line(10, 4, -0.2), _line(11, 4, -0.1), _line(9, 3, 0.5), _line(10, 3, 0.6)]
    got = account(timeline, 0.0, 0.7, full_world=4, ideal_rate=10.0, stall_gap=0.25)
    # 11 was the counter; the group restarted from checkpoint 8: 9, 10, 11 are lost.
    assert (got.completed, got.lost, got.progress) == (2, 3, -1)
    # Before the first step in the window: a stall of 0.5 s; then 0.1 s at 3, tail 0.1 s at 3.
    assert (got.stalled_s, got.reduced_s, got.full_s) == pytest.approx((0.5, 0.2, 0.0))


def test_two_restarts_count_each_discarded_step_once_per_discard() -> None:
    steps = [1, 2, 3, 4, 3, 4, 5, 4, 5, 6]  # restart from 2 after 4, from 3 after 5
    timeline = [_line(s, 4, (i + 1) / 10) for i, s in enumerate(steps)]
    got = account(timeline, 0.0, 1.0, full_world=4, ideal_rate=10.0, stall_gap=0.5)
    assert (got.completed, got.lost, got.restarts, got.progress) == (10, 4, 2, 6)


def test_goodput_is_progress_over_ideal_and_none_without_a_baseline() -> None:
    timeline = [_line(i, 4, i / 10) for i in range(1, 6)]
    got = account(timeline, 0.0, 1.0, full_world=4, ideal_rate=10.0, stall_gap=0.25)
    assert got.goodput == pytest.approx(0.5)
    none = account(timeline, 0.0, 1.0, full_world=4, ideal_rate=0.0, stall_gap=0.25)
    assert none.goodput is None


@pytest.mark.parametrize(("start", "end", "gap"), [(1.0, 1.0, 0.5), (0.0, 1.0, 0.0)])
def test_account_refuses_an_empty_window_or_gap(start: float, end: float, gap: float) -> None:
    with pytest.raises(ValueError):
        account([], start, end, full_world=4, ideal_rate=1.0, stall_gap=gap)


def test_progress_curve_is_relative_to_the_window() -> None:
    timeline = [_line(1, 4, 9.5), _line(2, 4, 10.5), _line(3, 3, 11.0), _line(4, 3, 12.5)]
    assert progress_curve(timeline, 10.0, 12.0) == [(0.5, 2), (1.0, 3)]
