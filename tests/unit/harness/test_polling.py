"""``e2e.polling.poll_until``: the one bounded wait loop, bounded in count as in time."""

from __future__ import annotations

import itertools
import types

import pytest

from e2e import polling
from e2e.polling import poll_until


def test_stops_at_the_first_truthy_answer_and_returns_it() -> None:
    answers = iter([0, "", "ready", "never asked"])
    got = poll_until(lambda: next(answers), timeout_s=60, interval_s=0.001)
    assert got and got.value == "ready" and got.tries == 3
    assert next(answers) == "never asked"


def test_a_given_count_bound_ends_the_wait_with_the_last_answer() -> None:
    calls = itertools.count(1)
    got = poll_until(lambda: next(calls) > 100, timeout_s=60, interval_s=0.001, max_tries=5)
    assert not got and got.value is False and got.tries == 5


def test_asks_at_least_once_even_with_no_time_left() -> None:
    calls: list[int] = []
    got = poll_until(lambda: calls.append(1), timeout_s=0, interval_s=0.1)
    assert not got and got.tries == 1 and calls == [1]


def test_a_stuck_clock_still_ends_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default count bound, timeout over interval plus the first and last look."""
    stuck = types.SimpleNamespace(monotonic=lambda: 1000.0, sleep=lambda s: None)
    monkeypatch.setattr(polling, "time", stuck)
    got = poll_until(lambda: False, timeout_s=1.0, interval_s=0.25)
    assert not got and got.tries == 6


def test_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        poll_until(lambda: True, timeout_s=1, interval_s=0)
