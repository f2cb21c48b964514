"""A per-job work queue: dedupes keys, delays requeues, never runs one key twice at once.

Where it sits: handlers ``add`` job keys on every relevant watch event; the
reconciler's workers ``get`` them. Like client-go's rate-limited queue: a key
added while it is being processed is run again after ``done``; a delayed add
never postpones an earlier one. ``cancel_all`` stops the background tasks of
the reconciler and of leader election alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


async def cancel_all(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel ``tasks``, wait until each has finished unwinding, and empty the list."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    tasks.clear()


class WorkQueue(Generic[K]):
    def __init__(self) -> None:
        self._due: dict[K, float] = {}
        self._heap: list[tuple[float, int, K]] = []
        self._seq = 0
        self._active: set[K] = set()
        self._again: dict[K, float] = {}
        self._wake = asyncio.Event()
        self.on_wait: Callable[[float], None] | None = None
        """Called with how long each key ``get`` hands out waited since it was due (metrics)."""

    def __len__(self) -> int:
        return len(self._due)

    def ready(self) -> int:
        """Keys due now and not yet taken (the backlog; delayed keys are not in it)."""
        now = time.monotonic()
        due = list(self._due.values())  # one C-level copy: a scrape runs in another thread
        return sum(1 for when in due if when <= now)

    def add(self, key: K, delay: float = 0.0) -> None:
        when = time.monotonic() + max(0.0, delay)
        if key in self._active:
            self._again[key] = min(when, self._again.get(key, when))
            return
        if key in self._due and self._due[key] <= when:
            return
        self._due[key] = when
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, key))
        self._wake.set()

    def discard(self, key: K) -> None:
        self._due.pop(key, None)
        self._again.pop(key, None)

    async def get(self) -> K:
        while True:
            now = time.monotonic()
            while self._heap:
                when, _, key = self._heap[0]
                if self._due.get(key) != when:
                    heapq.heappop(self._heap)  # superseded or discarded entry
                    continue
                if when > now:
                    break
                heapq.heappop(self._heap)
                del self._due[key]
                self._active.add(key)
                if self.on_wait is not None:
                    self.on_wait(now - when)
                return key
            timeout = (self._heap[0][0] - now) if self._heap else None
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    def done(self, key: K) -> None:
        self._active.discard(key)
        if key in self._again:
            when = self._again.pop(key)
            self.add(key, when - time.monotonic())
