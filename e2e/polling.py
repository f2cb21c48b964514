"""Bounded polling: the one wait loop the harness, the tests and the benchmarks share.

Where it sits: below everything that waits for a state it cannot be told
about (a process gone, a pod Running, a line in a log, a metric): the e2e
harness itself, ``tests.support.wait_for`` (which fails the test on a
timeout), and the benchmarks' waits (which report and go on). It imports
only the standard library, like :mod:`e2e.localproc`.

Every wait is bounded in time (``timeout_s``) and in count (``max_tries``,
by default what the interval allows in that time, plus the last look), as
the house rules want of any loop that may hit a server. The predicate is
always asked at least once, and once more at the deadline, so a state
reached during the last sleep is not missed.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Polled(Generic[T]):
    """The predicate's last answer; true when it held (the answer was truthy)."""

    value: T
    at: float  # time.monotonic() of that answer
    tries: int

    def __bool__(self) -> bool:
        return bool(self.value)


def poll_until(
    predicate: Callable[[], T],
    timeout_s: float,
    interval_s: float = 0.2,
    max_tries: int | None = None,
) -> Polled[T]:
    """Ask ``predicate`` every ``interval_s`` until its answer is truthy, or the bound is hit."""
    if interval_s <= 0:
        raise ValueError(f"interval_s must be positive, not {interval_s}")
    if max_tries is None:
        max_tries = math.ceil(timeout_s / interval_s) + 2
    deadline = time.monotonic() + timeout_s
    tries = 0
    while True:
        value = predicate()
        tries += 1
        now = time.monotonic()
        if value or now >= deadline or tries >= max_tries:
            return Polled(value, now, tries)
        time.sleep(min(interval_s, deadline - now))
