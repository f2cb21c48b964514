"""The goodput benchmark's report: a slot not built yet never shows a number; ratios; the plot."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import _goodput_report as rep
from benchmarks import report
from benchmarks._chaos import KILL, REPLACE, ChaosEvent
from benchmarks._goodput_stats import Goodput

LAUNCHERS = ("torchflex", "torchflex-state", "torchrun-tuned", "torchrun-default")
NOT_BUILT = {"torchflex-state": "the state API does not exist yet"}
SCHEDULE = {0: [ChaosEvent(3.0, KILL, 1), ChaosEvent(5.0, REPLACE, 1)]}


def _run(launcher: str, completed: int, lost: int, ideal: float = 100.0) -> rep.Run:
    g = Goodput(completed=completed, lost=lost, ideal=ideal, full_s=6.0, reduced_s=3.0,
                stalled_s=1.0, restarts=1 if lost else 0)  # fmt: skip
    return rep.Run(launcher, 0, ideal_rate=ideal / 10, result=g, curve=[(0.1, 1), (0.2, 2)])


RUNS = [_run("torchflex", 85, 5), _run("torchrun-tuned", 40, 0), _run("torchrun-default", 20, 0)]


def test_a_slot_not_built_says_so_in_the_table_and_the_json() -> None:
    text = rep.table(LAUNCHERS, NOT_BUILT, RUNS)
    state_row = next(line for line in text.splitlines() if line.startswith("| torchflex-state"))
    assert state_row.count(rep.NOT_BUILT) == 9
    assert not any(ch.isdigit() for ch in state_row)
    result = rep.summary(LAUNCHERS, NOT_BUILT, RUNS, SCHEDULE)
    assert result["launchers"]["torchflex-state"] == {
        "status": "not built yet", "why": "the state API does not exist yet",
    }  # fmt: skip


def test_summary_medians_and_headline_ratios() -> None:
    result = rep.summary(LAUNCHERS, NOT_BUILT, RUNS, SCHEDULE)
    tf = result["launchers"]["torchflex"]
    assert (tf["status"], tf["goodput"], tf["lost"]) == ("measured", pytest.approx(0.8), 5)
    assert result["goodput_ratio_vs_tuned"] == pytest.approx(2.0)
    assert result["goodput_ratio_vs_default"] == pytest.approx(4.0)
    assert result["schedules"]["0"][0] == {"time": 3.0, "action": KILL, "node": 1}
    tf_row = rep.table(LAUNCHERS, NOT_BUILT, RUNS).splitlines()[2]
    assert tf_row.startswith("| torchflex | 80 % (80-80, n=1) | 85 (85-85, n=1) | 5 (5-5, n=1) |")
    assert rep.headline(result) == (
        "Goodput of torchflex (unchanged script) vs torchrun: 4.0x vs defaults, 2.0x vs tuned."
    )


def test_no_ratio_without_both_measurements() -> None:
    result = rep.summary(["torchflex", "torchrun-tuned"], {}, [RUNS[0]], SCHEDULE)
    assert result["goodput_ratio_vs_tuned"] is None
    assert result["goodput_ratio_vs_default"] is None
    assert "n/a vs defaults, n/a vs tuned" in rep.headline(result)
    row = next(line for line in rep.table(["torchrun-tuned"], {}, []).splitlines()[2:])
    assert row.startswith("| torchrun-tuned | n/a |")


def test_schedule_table_lists_every_event() -> None:
    lines = rep.schedule_table(SCHEDULE).splitlines()
    assert lines[2:] == ["| 0 | 3 s | kill | node slot 1 |", "| 0 | 5 s | replace | node slot 1 |"]
    assert rep.schedule_table({0: []}) == "(no events)"


def test_plot_writes_the_png(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(report, "PLOTS_DIR", tmp_path / "plots")
    path = rep.plot(RUNS, SCHEDULE[0], 10.0)
    assert path == tmp_path / "plots" / "goodput.png"
    assert path.read_bytes().startswith(b"\x89PNG")
