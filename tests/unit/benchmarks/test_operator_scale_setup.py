"""Parsing the bash ``time`` output of a set-up log for the Setup section."""

from __future__ import annotations

import pytest

from benchmarks._scale_setup import parse_time


def test_parse_time_reads_minutes_and_seconds() -> None:
    text = "go: downloading x\n\nreal\t14m56.683s\nuser\t11m53.513s\nsys\t2m51.871s\n"
    got = parse_time(text)
    assert got["real"] == pytest.approx(896.683)
    assert got["user"] == pytest.approx(713.513)
    assert got["sys"] == pytest.approx(171.871)


def test_parse_time_without_minutes_and_last_wins() -> None:
    assert parse_time("real\t1.5s\nreal\t0m2.25s\n") == {"real": 2.25}
    assert parse_time("nothing here") == {}
