"""``KVStore`` over a c10d ``TCPStore`` client (``--rdzv-backend c10d``).

Where it sits: the agent connects to the per-job store pod
(``torchflex-agent store``, see ``store_server``) as a client only; no agent
ever hosts the store, so losing any node never loses the rendezvous state.
``wait`` is the server-side blocking wait: a waiter is woken by the write
itself, with no polling.

Two TCPStore quirks shape this module. ``get`` blocks until the key exists,
so a non-blocking read uses ``compare_set`` with a sentinel that no writer
ever stores: for an absent key the server answers with the expected value
(the sentinel) without writing it, for a present key with its value. That
read wakes the key's waiters although nothing was written, so ``wait``
confirms every wakeup before it reports one. And a client serializes its
operations, hence ``clone()`` per blocking thread.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Sequence
from typing import cast

from torch._C._distributed_c10d import TCPStore
from torch.distributed import DistError, DistNetworkError, DistStoreError

from torchflex_agent.errors import StoreUnavailableError

# Written by nobody: a leading NUL plus a fixed tag cannot collide with the
# decimal counters and JSON documents the rendezvous stores.
_ABSENT = b"\x00torchflex-absent\x00"
_ABSENT_OTHER = b"\x00torchflex-absent-other\x00"


def _s(value: bytes) -> str:
    """Pass bytes where the stub says str: pybind's std::string takes bytes unchanged."""
    return cast(str, value)


class TCPKVStore:
    """A client connection to a TCPStore server."""

    wait_slice = 0.5  # a server-side wait costs one small request

    def __init__(self, host: str, port: int, connect_timeout: float = 10.0) -> None:
        self.host = host
        self.port = port
        self._connect_timeout = connect_timeout
        try:
            self._store = TCPStore(
                host,
                port,
                is_master=False,
                wait_for_workers=False,
                timeout=datetime.timedelta(seconds=connect_timeout),
            )
        except (DistError, RuntimeError) as exc:
            raise StoreUnavailableError(f"cannot connect to store {host}:{port}: {exc}") from exc

    def _unavailable(self, exc: BaseException) -> StoreUnavailableError:
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return StoreUnavailableError(f"store {self.host}:{self.port}: {first_line}")

    def get(self, key: str) -> bytes | None:
        try:
            value = self._store.compare_set(key, _s(_ABSENT), _s(_ABSENT_OTHER))
        except (DistError, RuntimeError) as exc:
            raise self._unavailable(exc) from exc
        return None if value == _ABSENT else value

    def set(self, key: str, value: bytes) -> None:
        try:
            self._store.set(key, _s(value))
        except (DistError, RuntimeError) as exc:
            raise self._unavailable(exc) from exc

    def add(self, key: str, amount: int) -> int:
        try:
            return int(self._store.add(key, amount))
        except (DistError, RuntimeError) as exc:
            raise self._unavailable(exc) from exc

    def take_ticket(self, key: str) -> int:
        return self.add(key, 1)  # the server's add is atomic: no contention to avoid

    def tickets(self, key: str) -> int:
        return self.add(key, 0)

    def compare_set(self, key: str, expected: bytes | None, desired: bytes) -> bytes | None:
        if not desired:
            raise ValueError("compare_set needs a non-empty desired value")
        want = b"" if expected is None else expected
        try:
            value = self._store.compare_set(key, _s(want), _s(desired))
        except (DistError, RuntimeError) as exc:
            raise self._unavailable(exc) from exc
        if expected is not None and value == expected and expected != desired:
            # The server echoes a non-empty expected value when the key is absent.
            return None
        return value

    def wait(self, keys: Sequence[str], timeout: float) -> bool:
        # The libuv server wakes every waiter on a key whenever anyone runs a
        # compare_set on it, even one that leaves it absent -- which is how
        # ``get`` reads. A wakeup is therefore only a hint: confirm with
        # ``check`` (a pure read) and wait again for what is left of the time.
        deadline = time.monotonic() + timeout
        names = list(keys)
        while True:
            if not self._wait_once(names, deadline - time.monotonic()):
                return False
            try:
                if self._store.check(names):
                    return True
            except (DistError, RuntimeError) as exc:
                raise self._unavailable(exc) from exc
            if time.monotonic() >= deadline:
                return False

    def _wait_once(self, keys: list[str], timeout: float) -> bool:
        # The server rejects a zero timeout as "no timeout"; keep a floor.
        ms = max(1, int(timeout * 1000))
        try:
            self._store.wait(keys, datetime.timedelta(milliseconds=ms))
        except DistNetworkError as exc:
            raise self._unavailable(exc) from exc
        except DistStoreError:
            # DistStoreError without a network cause is the wait timing out;
            # the client cancels the wait server-side, so the connection stays usable.
            return False
        except (DistError, RuntimeError) as exc:
            raise self._unavailable(exc) from exc
        return True

    def clone(self) -> TCPKVStore:
        return TCPKVStore(self.host, self.port, self._connect_timeout)

    def close(self) -> None:
        # TCPStore has no explicit close; dropping the last reference closes the socket.
        del self._store


class MasterStore:
    """A TCPStore server the agent runs for its workers' process group (one per round).

    Bound to an ephemeral port when created, so the port published in the
    node's descriptor is already taken by us (no free-port race) and is
    listening before any worker of the round starts.
    """

    def __init__(self) -> None:
        try:
            self._store: TCPStore | None = TCPStore(
                "0.0.0.0",
                0,
                is_master=True,
                wait_for_workers=False,
                timeout=datetime.timedelta(seconds=60),
            )
        except (DistError, RuntimeError) as exc:
            raise StoreUnavailableError(f"cannot serve a master store: {exc}") from exc
        self.port = int(self._store.port)

    def close(self) -> None:
        # The server stops when its last reference goes.
        self._store = None


def connect_with_retry(host: str, port: int, deadline: float) -> TCPKVStore:
    """Connect, retrying with backoff until ``deadline`` (a ``time.monotonic()`` value).

    Used after the store pod restarted: the new pod may take seconds to bind.
    """
    delay = 0.05
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise StoreUnavailableError(f"store {host}:{port} unreachable until the deadline")
        try:
            return TCPKVStore(host, port, connect_timeout=min(max(left, 0.1), 2.0))
        except StoreUnavailableError:
            if deadline - time.monotonic() <= 0:
                raise
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.5)
