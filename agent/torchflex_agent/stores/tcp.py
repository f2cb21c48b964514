"""``KVStore`` over a c10d ``TCPStore`` client (``--rdzv-backend c10d``).

Where it sits: the agent connects to the per-job store pod
(``torchflex-agent store``, see ``stores.server``) as a client only; no agent
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

No TCPStore client call is bounded on its own: against a server that is
alive but silent (SIGSTOP, a frozen node) ``add`` and even a timed ``wait``
(whose cancel is one more round trip) block until the server wakes. So
every call runs on the connection's own helper thread and the caller waits
at most ``op_timeout`` (plus the wait's own timeout) for it. A call that
overruns breaks the connection for good -- its reply may still come, for a
request the caller gave up on -- and raises ``StoreUnavailableError`` (the
agent's StoreLost path: reconnect, re-form); the abandoned helper thread
ends when the server answers or the socket closes.
"""

from __future__ import annotations

import datetime
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar, cast

from torch._C._distributed_c10d import TCPStore
from torch.distributed import DistError, DistNetworkError, DistStoreError

from torchflex_agent.errors import StoreUnavailableError

# Written by nobody: a leading NUL plus a fixed tag cannot collide with the
# decimal counters and JSON documents the rendezvous stores.
_ABSENT = b"\x00torchflex-absent\x00"
_ABSENT_OTHER = b"\x00torchflex-absent-other\x00"

# Up to this many keys ``get_many`` reads one by one: a check plus a
# multi_get only pays off when most keys exist.
_SMALL_READ = 4

OP_TIMEOUT_S = 2.0
"""Longest a store operation may take: each is one small request on a LAN, so
anything near this means the server is frozen or cut off, not busy."""

_T = TypeVar("_T")


class _Runner:
    """One daemon thread that runs a connection's calls in order.

    Daemon, unlike ``concurrent.futures`` workers (joined at interpreter
    exit): a thread left blocked on a silent server must never keep the
    agent from exiting.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], object], _Result] | None] = (
            queue.SimpleQueue()
        )
        threading.Thread(target=self._run, daemon=True, name="tcpstore").start()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, result = job
            try:
                result.value = fn()
            except BaseException as exc:  # handed to the caller, re-raised there
                result.error = exc
            result.done.set()

    def submit(self, fn: Callable[[], object]) -> _Result:
        result = _Result()
        self._jobs.put((fn, result))
        return result

    def stop(self) -> None:
        self._jobs.put(None)


class _Result:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: object = None
        self.error: BaseException | None = None


def _s(value: bytes) -> str:
    """Pass bytes where the stub says str: pybind's std::string takes bytes unchanged."""
    return cast(str, value)


class TCPKVStore:
    """A client connection to a TCPStore server."""

    wait_slice = 0.5  # a server-side wait costs one small request

    def __init__(
        self,
        host: str,
        port: int,
        connect_timeout: float = 10.0,
        op_timeout: float = OP_TIMEOUT_S,
    ) -> None:
        self.host = host
        self.port = port
        self._connect_timeout = connect_timeout
        self._op_timeout = op_timeout
        self._broken = ""
        self._runner = _Runner()

        def connect() -> TCPStore:
            return TCPStore(
                host,
                port,
                is_master=False,
                wait_for_workers=False,
                timeout=datetime.timedelta(seconds=connect_timeout),
            )

        try:
            # The connect's own timeout covers the TCP handshake; a frozen
            # server accepts (the kernel does) and then never answers the
            # client's first request, hence the deadline around it too.
            self._store = self._call(connect, connect_timeout)
        except StoreUnavailableError as exc:
            self._runner.stop()
            raise StoreUnavailableError(f"cannot connect to store {host}:{port}: {exc}") from exc

    def _call(self, fn: Callable[[], _T], extra: float = 0.0) -> _T:
        """Run one client call with a deadline of ``op_timeout + extra`` seconds."""
        if self._broken:
            raise StoreUnavailableError(f"store {self.host}:{self.port}: {self._broken}")
        result = self._runner.submit(fn)
        if not result.done.wait(self._op_timeout + extra):
            self._broken = f"no reply within {self._op_timeout + extra:g}s (store silent)"
            self._runner.stop()
            raise StoreUnavailableError(f"store {self.host}:{self.port}: {self._broken}")
        if isinstance(result.error, (DistError, RuntimeError)):
            raise self._unavailable(result.error) from result.error
        if result.error is not None:
            raise result.error
        return cast(_T, result.value)

    def _unavailable(self, exc: BaseException) -> StoreUnavailableError:
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return StoreUnavailableError(f"store {self.host}:{self.port}: {first_line}")

    def get(self, key: str) -> bytes | None:
        value = self._call(lambda: self._store.compare_set(key, _s(_ABSENT), _s(_ABSENT_OTHER)))
        return None if value == _ABSENT else value

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        names = list(keys)
        if len(names) <= _SMALL_READ:
            # Not ``get``: its compare_set wakes every waiter on the key, and
            # N joiners reading ``closed`` while N wait on it is O(N^2) wakeups
            # (1,024 agents stalled the store past the 2 s call deadline).
            return [self._read_quietly(k) for k in names]
        # ``multi_get`` blocks like ``get`` on an absent key, so it runs only
        # after ``check`` (a pure read) saw every key: keys are never deleted,
        # so it cannot block then. Some absent: each half on its own, so a
        # present run (a round's descriptors) still costs two requests.
        if self._call(lambda: self._store.check(names)):
            return list(self._call(lambda: self._store.multi_get(names)))
        half = len(names) // 2
        return self.get_many(names[:half]) + self.get_many(names[half:])

    def _read_quietly(self, key: str) -> bytes | None:
        """``get`` without waking the key's waiters: ``check``, then read if present."""
        if not self._call(lambda: self._store.check([key])):
            return None
        return bytes(self._call(lambda: self._store.multi_get([key]))[0])

    def set(self, key: str, value: bytes) -> None:
        self._call(lambda: self._store.set(key, _s(value)))

    def add(self, key: str, amount: int) -> int:
        return int(self._call(lambda: self._store.add(key, amount)))

    def take_ticket(self, key: str) -> int:
        return self.add(key, 1)  # the server's add is atomic: no contention to avoid

    def tickets(self, key: str) -> int:
        return self.add(key, 0)

    def compare_set(self, key: str, expected: bytes | None, desired: bytes) -> bytes | None:
        if not desired:
            raise ValueError("compare_set needs a non-empty desired value")
        want = b"" if expected is None else expected
        value = self._call(lambda: self._store.compare_set(key, _s(want), _s(desired)))
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
            if self._call(lambda: self._store.check(names)):
                return True
            if time.monotonic() >= deadline:
                return False

    def _wait_once(self, keys: list[str], timeout: float) -> bool:
        # The server rejects a zero timeout as "no timeout"; keep a floor.
        ms = max(1, int(timeout * 1000))

        def wait() -> bool:
            try:
                self._store.wait(keys, datetime.timedelta(milliseconds=ms))
            except DistNetworkError:
                raise
            except DistStoreError:
                # DistStoreError without a network cause is the wait timing out; the
                # client cancels the wait server-side, so the connection stays usable.
                return False
            return True

        return self._call(wait, ms / 1000)

    def clone(self) -> TCPKVStore:
        return TCPKVStore(self.host, self.port, self._connect_timeout, self._op_timeout)

    def close(self) -> None:
        # TCPStore has no explicit close; dropping the last reference closes the
        # socket (a helper thread blocked on a silent server keeps its own until then).
        self._runner.stop()
        self.__dict__.pop("_store", None)


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
