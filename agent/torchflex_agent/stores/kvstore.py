"""The small key-value interface the rendezvous is written against.

Where it sits: ``rendezvous.protocol`` and ``rendezvous.liveness`` talk only to ``KVStore``; the
backends are ``MemoryStore`` (below, pure-logic tests and ``--rdzv-backend
memory`` inside one process), ``stores.tcp.TCPKVStore`` (c10d TCPStore) and
``stores.etcd.EtcdKVStore`` (etcd v3). Each method is one round trip where the
backend allows it. Blocking calls take a timeout so every caller's loop is
bounded in time.

A backend connection serves one thread at a time (TCPStore clients serialize
operations, so a blocked ``wait`` would stall a heartbeat): threads that
block get their own connection from ``clone()``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Protocol

from torchflex_agent.errors import StoreUnavailableError


class KVStore(Protocol):
    """Operations every rendezvous backend provides.

    Every method raises ``StoreUnavailableError`` when the backend cannot be
    reached; values are opaque bytes except for ``add`` counters, which are
    decimal ASCII so all backends agree on their representation.
    """

    wait_slice: float
    """Seconds one ``wait`` of a polling loop should block at most.

    Blocked waits are woken by the write itself; the slice only bounds how
    late a loop notices its own deadline or a stop request. Short where a
    wait is cheap (a TCPStore server-side wait); longer where each one costs
    a new watch stream (etcd), because N joiners re-waiting every slice load
    the server enough to slow the very rendezvous they wait for.
    """

    def get(self, key: str) -> bytes | None:
        """The value of ``key``, or None if it does not exist (never blocks)."""
        ...

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """The values of ``keys``, in order, None where absent (never blocks).

        One round trip where the backend allows it (etcd: one range over
        the keys' common parent; c10d: ``check`` then ``multi_get``), so a
        closer reading N descriptors pays one request, not N.
        """
        ...

    def set(self, key: str, value: bytes) -> None: ...

    def add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to a counter (absent = 0); returns the new value."""
        ...

    def take_ticket(self, key: str) -> int:
        """Take the next number of a ticket counter: 1, 2, ... in the order takers arrive.

        Numbers are unique and dense. A ticket counter is only ever taken
        from and counted (``tickets``), never read with ``get`` or written
        otherwise, so a backend without an atomic increment may keep it in
        any form: etcd keeps one key per ticket, ordered by its revision,
        instead of a counter N joiners would fight over.
        """
        ...

    def tickets(self, key: str) -> int:
        """How many tickets of ``key`` were taken so far (never blocks)."""
        ...

    def compare_set(self, key: str, expected: bytes | None, desired: bytes) -> bytes | None:
        """Set ``key`` to ``desired`` iff it holds ``expected`` (None: absent).

        Returns the value the key holds afterwards (None if absent). Callers
        make ``desired`` unique (it carries their node id) so that
        ``result == desired`` means they won.
        """
        ...

    def wait(self, keys: Sequence[str], timeout: float) -> bool:
        """Block until all ``keys`` exist; False if ``timeout`` seconds passed first."""
        ...

    def clone(self) -> KVStore:
        """A new, independent connection to the same backend."""
        ...

    def close(self) -> None: ...


class _MemoryData:
    """The state shared by all connections of one in-memory store."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.cond = threading.Condition()
        self.available = True


class MemoryStore:
    """An in-process ``KVStore``: for pure logic tests and single-process use.

    ``set_available(False)`` simulates a lost backend: every call then raises
    ``StoreUnavailableError`` like a dropped TCP connection would.
    """

    wait_slice = 0.5

    def __init__(self, data: _MemoryData | None = None) -> None:
        self._data = data if data is not None else _MemoryData()

    def _check(self) -> None:
        if not self._data.available:
            raise StoreUnavailableError("memory store marked unavailable")

    def set_available(self, available: bool) -> None:
        with self._data.cond:
            self._data.available = available
            if available:
                self._data.values.clear()  # a restarted store comes back empty
            self._data.cond.notify_all()

    def get(self, key: str) -> bytes | None:
        with self._data.cond:
            self._check()
            return self._data.values.get(key)

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        with self._data.cond:
            self._check()
            return [self._data.values.get(k) for k in keys]

    def set(self, key: str, value: bytes) -> None:
        with self._data.cond:
            self._check()
            self._data.values[key] = value
            self._data.cond.notify_all()

    def add(self, key: str, amount: int) -> int:
        with self._data.cond:
            self._check()
            new = int(self._data.values.get(key, b"0")) + amount
            self._data.values[key] = str(new).encode()
            self._data.cond.notify_all()
            return new

    def take_ticket(self, key: str) -> int:
        return self.add(key, 1)

    def tickets(self, key: str) -> int:
        return self.add(key, 0)

    def compare_set(self, key: str, expected: bytes | None, desired: bytes) -> bytes | None:
        with self._data.cond:
            self._check()
            current = self._data.values.get(key)
            if current == expected:
                self._data.values[key] = desired
                self._data.cond.notify_all()
                return desired
            return current

    def wait(self, keys: Sequence[str], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._data.cond:
            while True:
                self._check()
                if all(k in self._data.values for k in keys):
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._data.cond.wait(left)

    def clone(self) -> MemoryStore:
        return MemoryStore(self._data)

    def close(self) -> None:
        pass
