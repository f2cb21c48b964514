"""The state API's step-time report: overhead arithmetic, a mode not run, the JSON shape."""

from __future__ import annotations

import json

import pytest

from benchmarks import _commit_report as rep
from benchmarks.state_commit import order


@pytest.mark.parametrize(
    ("mode", "base", "want"),
    [
        (0.105, 0.100, 5.0),  # 5 ms on a 100 ms step
        (0.100, 0.100, 0.0),
        (0.098, 0.100, -2.0),  # faster than the baseline: negative, not clamped
        (0.101, None, None),  # no baseline
        (None, 0.100, None),  # mode not run
        (0.101, 0.0, None),  # a baseline of zero has no ratio
    ],
)
def test_overhead_arithmetic(mode: float | None, base: float | None, want: float | None) -> None:
    got = rep.overhead_pct(mode, base)
    assert got == (None if want is None else pytest.approx(want))


def _sample(mode: str, rnd: int, step: float, commit: float = 0.0) -> rep.Sample:
    s = rep.Sample(mode, rnd, steps=[step, step, step + 0.010])
    if mode != rep.BASELINE:
        s.commits = [commit, commit, commit * 2]
    if mode == rep.SHARDED:
        s.landed, s.probes = [0.004, 0.006], 3
    return s


# Two rounds: baseline 100 ms, replicated 101 ms then 103 ms, sharded 102 ms.
SAMPLES = [
    _sample(rep.BASELINE, 0, 0.100), _sample(rep.REPLICATED, 0, 0.101, 0.001),
    _sample(rep.SHARDED, 0, 0.102, 0.0012), _sample(rep.BASELINE, 1, 0.100),
    _sample(rep.REPLICATED, 1, 0.103, 0.001), _sample(rep.SHARDED, 1, 0.102, 0.0012),
]  # fmt: skip


def test_summary_pools_rounds_and_keeps_each_rounds_overhead() -> None:
    result = rep.summary(SAMPLES, ranks=3, step_time=0.1)
    assert (result["target_pct"], result["within_target"]) == (5.0, True)
    base, repl, shard = (result["modes"][m] for m in rep.MODES)
    assert (base["status"], base["overhead_pct"], base["steps"]) == ("measured", None, 6)
    assert base["step_median_s"] == pytest.approx(0.100)
    assert base["step_p90_s"] == pytest.approx(0.110)
    # Pooled steps 101, 101, 111, 103, 103, 113 ms: median 103 ms.
    assert repl["overhead_pct"] == pytest.approx(3.0)
    assert repl["overhead_pct_per_round"] == [pytest.approx(1.0), pytest.approx(3.0)]
    assert repl["commit_median_s"] == pytest.approx(0.001)
    assert "copies_probed" not in repl
    assert shard["overhead_pct"] == pytest.approx(2.0)
    assert (shard["copies_seen"], shard["copies_probed"]) == (4, 6)
    assert shard["copy_landed_median_s"] == pytest.approx(0.005)


def test_json_shape_is_plain_and_stable() -> None:
    result = rep.summary(SAMPLES, ranks=3, step_time=0.1)
    assert json.loads(json.dumps(result)) == result
    assert set(result) == {"ranks", "step_time_s", "target_pct", "modes", "within_target"}
    assert list(result["modes"]) == list(rep.MODES)
    assert set(result["modes"][rep.SHARDED]) == {
        "status", "rounds", "steps", "step_median_s", "step_p90_s", "overhead_pct",
        "overhead_pct_per_round", "commit_median_s", "commit_p90_s", "copy_landed_median_s",
        "copy_landed_p90_s", "copies_seen", "copies_probed",
    }  # fmt: skip


def test_over_target_is_said() -> None:
    slow = [_sample(rep.BASELINE, 0, 0.100), _sample(rep.SHARDED, 0, 0.106, 0.005)]
    result = rep.summary(slow, ranks=3, step_time=0.1)
    assert result["within_target"] is False
    assert "NOT met" in rep.verdict(result)


def test_markdown_rows_and_a_mode_not_run() -> None:
    only = [s for s in SAMPLES if s.mode != rep.SHARDED]
    result = rep.summary(only, ranks=3, step_time=0.1)
    assert result["modes"][rep.SHARDED] == {"status": rep.NOT_RUN}
    text = rep.markdown(result, rounds=2, probe_every=10, load="LOAD LINE")
    rows = [line for line in text.splitlines() if line.startswith("| ")][1:]
    assert rows[0] == ("| no state API | 100.00 ms | 110.00 ms | (the reference) | - | - | - | 6 |")
    assert rows[1].startswith(
        "| replicated | 103.00 ms | 113.00 ms | +3.0 % (rounds +1.0 to +3.0 %) | 1.00 ms |"
    )
    assert rows[2] == "| sharded=True |" + " not run |" * 7
    assert not any(ch.isdigit() for ch in rows[2])
    assert text.startswith("Target: step-time overhead <= 5 % (issue 18): met")
    assert "fixed `time.sleep(0.1)`" in text and "2 round(s)" in text
    assert text.rstrip().endswith("LOAD LINE")


def test_without_a_baseline_no_mode_has_an_overhead() -> None:
    result = rep.summary([_sample(rep.SHARDED, 0, 0.102, 0.001)], ranks=2, step_time=0.1)
    assert result["modes"][rep.SHARDED]["overhead_pct"] is None
    assert result["within_target"] is None
    assert "not measured here" in rep.verdict(result)
    row = next(line for line in rep.table(result).splitlines() if "sharded=True" in line)
    assert "| n/a |" in row and "(2 of 3 seen within the step)" in row


def test_modes_rotate_each_round() -> None:
    assert [order(r, rep.MODES) for r in range(4)] == [
        ["baseline", "replicated", "sharded"],
        ["replicated", "sharded", "baseline"],
        ["sharded", "baseline", "replicated"],
        ["baseline", "replicated", "sharded"],
    ]
    assert order(1, ["sharded"]) == ["sharded"]
