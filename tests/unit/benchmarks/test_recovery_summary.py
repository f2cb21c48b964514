"""The recovery benchmark's summary: medians per launcher, speed-ups, JSON round trip."""

from __future__ import annotations

import json

import pytest

from benchmarks.recovery import Trial, markdown, markdown_freeze, summary, trials_from_json


def _trials() -> list[Trial]:
    return [
        Trial("torchflex", 0.3, 2.5),
        Trial("torchflex", 0.5, 3.0),
        Trial("torchflex", 0.4, None, "the new node did not train at world 3 within 60 s"),
        Trial("torchrun-tuned", 6.0, None, "join timed out"),
        Trial("torchrun-tuned", 8.0, None, "join timed out"),
        Trial("torchrun-default", 46.0, 40.0),
    ]


def test_summary_medians_and_speedups() -> None:
    result = summary(_trials())
    assert result["torchflex_s"] == pytest.approx(0.4)
    assert result["torchflex_join_s"] == pytest.approx(2.75)
    assert result["torchrun_tuned_s"] == pytest.approx(7.0)
    assert result["torchrun_tuned_join_s"] is None
    assert result["speedup_vs_default"] == pytest.approx(46.0 / 0.4)
    assert result["speedup_vs_tuned"] == pytest.approx(7.0 / 0.4)
    json.dumps(result)  # the --json output is one JSON object


def test_summary_without_torchflex_has_no_speedup() -> None:
    result = summary([Trial("torchrun-default", 46.0, None)])
    assert result["torchflex_s"] is None
    assert result["speedup_vs_default"] is None


def test_trials_round_trip_through_json() -> None:
    trials = _trials()
    again = trials_from_json(json.loads(json.dumps(summary(trials))))
    assert sorted((t.flavor, t.recovery_s, t.join_s) for t in again) == sorted(
        (t.flavor, t.recovery_s, t.join_s) for t in trials
    )


def test_markdown_counts_failures_per_phase() -> None:
    text = markdown(_trials(), summary(_trials()))
    assert "| torchrun-tuned | n/a | 7.00 s (6.00-8.00, n=2) | n/a | 0 / 2 |" in text
    assert "| torchflex | n/a | 0.40 s (0.30-0.50, n=3) | 2.75 s (2.50-3.00, n=2) | 0 / 1 |" in text
    assert "join timed out" in text


def test_markdown_counts_only_the_joins_it_tried() -> None:
    trials = [
        Trial("torchflex", 0.3, None, join_tried=False),  # --no-join
        Trial("torchflex", None, None, "no recovery", join_tried=False),
    ]
    text = markdown(trials, summary(trials))
    assert "| torchflex | n/a | 0.30 s (0.30-0.30, n=1) | n/a | 1 / not run |" in text
    again = trials_from_json(json.loads(json.dumps(summary(trials))))
    assert [t.join_tried for t in again] == [False, False]


def test_state_api_launcher_has_its_own_row_and_median() -> None:
    trials = [
        *_trials(),
        Trial("torchflex-state", 0.2, 2.0, resumed_s=0.08),
        Trial("torchflex-state", 0.3, None, resumed_s=0.12),
    ]
    result = summary(trials)
    assert result["torchflex_state_s"] == pytest.approx(0.25)
    assert result["torchflex_state_resumed_s"] == pytest.approx(0.10)
    assert result["torchflex_state_join_s"] == pytest.approx(2.0)
    assert result["torchflex_s"] == pytest.approx(0.4)  # the unchanged script's row is its own
    assert result["torchflex_resumed_s"] is None  # its script prints no timed restored line
    text = markdown(trials, result)
    assert (
        "| torchflex-state | 0.10 s (0.08-0.12, n=2) | 0.25 s (0.20-0.30, n=2) "
        "| 2.00 s (2.00-2.00, n=1) | 0 / 1 |"
    ) in text
    # The header says what each recovery column measures.
    assert "SIGKILL → every survivor resumed (its `restored` line)" in text
    assert "SIGKILL → every survivor completed a step at world 2" in text
    again = trials_from_json(json.loads(json.dumps(result)))
    assert [t.resumed_s for t in again if t.flavor == "torchflex-state"] == [0.08, 0.12]


def test_freeze_table_has_both_recovery_columns_and_the_cap() -> None:
    trials = [
        Trial("torchflex-state", 1.7, None, resumed_s=1.6),
        Trial("torchrun-tuned", None, None, "survivors did not train at world 2 within 90 s"),
    ]
    text = markdown_freeze(trials, summary(trials), 90.0)
    assert "freeze → every survivor resumed (its `restored` line)" in text
    assert "| torchflex-state | 1.60 s (1.60-1.60, n=1) | 1.70 s (1.70-1.70, n=1) | 0 / 1 |" in text
    assert "| torchrun-tuned | n/a | > 90 s (cap) | 1 / 1 |" in text
