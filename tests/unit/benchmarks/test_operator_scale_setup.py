"""The Setup section: the bash ``time`` output of a set-up log, and the rows it gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks._scale_setup import body, parse_time


def test_parse_time_reads_minutes_and_seconds() -> None:
    text = "go: downloading x\n\nreal\t14m56.683s\nuser\t11m53.513s\nsys\t2m51.871s\n"
    got = parse_time(text)
    assert got["real"] == pytest.approx(896.683)
    assert got["user"] == pytest.approx(713.513)
    assert got["sys"] == pytest.approx(171.871)


def test_parse_time_without_minutes_and_last_wins() -> None:
    assert parse_time("real\t1.5s\nreal\t0m2.25s\n") == {"real": 2.25}
    assert parse_time("nothing here") == {}


def test_body_has_a_row_per_measurement_given(tmp_path: Path) -> None:
    log = tmp_path / "setup.log"
    log.write_text("real\t14m56.683s\n")
    text = body(log, parse_time(log.read_text()), cluster_up_s=6.4, ci_s=590.0, ci_tests=512)
    assert "| cold set-up: virtualenv + toolchain build from empty caches | 14 min 57 s" in text
    assert "warm caches, 512 tests | 9 min 50 s |" in text
    assert "idle machine | 6 s |" in text
    bare = body(log, {}, cluster_up_s=None, ci_s=None, ci_tests=None)
    assert ".ci/run` in a fresh clone" not in bare and "make cluster` (" not in bare
