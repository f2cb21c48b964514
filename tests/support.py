"""Small helpers for tests of every tier (bounded waits)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest


def wait_for(
    predicate: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.2
) -> None:
    """Poll ``predicate`` (bounded) until truthy; fail the test with ``what``."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return
        time.sleep(interval_s)
    pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what} (last: {last!r})")
