"""Opening the rendezvous store: bounded by a deadline, ended by SIGTERM, and never silent.

Where it sits: ``loop.agent.ElasticAgent`` opens its store connection through
``open_store`` at start-up and after losing the store; the ``connect``
function it passes (its backend's ``stores.registry.AgentBackend.opener``) is one
backend's connect-with-retry until a deadline.

Why attempts run on a thread of their own: a backend's connect blocks in
C code for as long as its attempt lasts (a TCPStore client against a
listener that never answers, an HTTP request to a silent etcd), and a
Python signal handler only runs when the main thread gets back to Python.
So each attempt (one call of ``connect`` with a deadline ``attempt_s``
ahead) runs on a daemon thread, and the caller waits on it in short polls:
SIGTERM ends the wait within one poll, the deadline within one poll, and
an attempt that never returns at all is left behind (its thread dies with
the process) while a fresh one starts, a bounded number of times.

Each failed attempt's error is kept; the first is logged at once and the
latest again every ``log_every`` seconds, so an agent waiting on an
unreachable store says what it is doing and why, instead of nothing for a
minute.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable

from torchflex_agent.errors import StoreUnavailableError
from torchflex_agent.rendezvous.protocol import RendezvousInterruptedError
from torchflex_agent.stores.kvstore import KVStore

log = logging.getLogger(__name__)

Connect = Callable[[float], KVStore]
"""Opens a store connection, retrying until the given ``time.monotonic()`` deadline."""

ATTEMPT_S = 2.0
"""Deadline handed to one ``connect`` call: its error comes back this often."""
LOG_EVERY_S = 3.0
"""While the store stays unreachable, a progress line at least this often."""
HUNG_AFTER_S = 15.0
"""An attempt still running after this long is left behind and a new one started."""
MAX_HUNG = 4
"""At most this many attempts are left running behind (each may hold a socket)."""
_POLL_S = 0.1
_MIN_SPACING_S = 0.5


@dataclasses.dataclass
class _Attempt:
    started: float
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    store: KVStore | None = None
    error: str = ""
    crash: Exception | None = None
    """Anything but ``StoreUnavailableError``: not retried, re-raised to the caller."""
    abandoned: bool = False
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def give_up(self) -> None:
        """Leave this attempt behind; a connection it still opens is closed at once."""
        with self.lock:
            self.abandoned = True
            store, self.store = self.store, None
        if store is not None:
            store.close()


def _run(connect: Connect, attempt: _Attempt, deadline: float) -> None:
    try:
        store = connect(deadline)
    except StoreUnavailableError as exc:
        attempt.error = str(exc) or type(exc).__name__
    except Exception as exc:  # handed to the waiting caller, not lost in a thread
        attempt.crash = exc
    else:
        with attempt.lock:
            keep = not attempt.abandoned
            if keep:
                attempt.store = store
        if not keep:
            store.close()
    attempt.done.set()


def _until(deadline: float, now: float) -> str:
    return (
        "no deadline" if math.isinf(deadline) else f"giving up in {max(0.0, deadline - now):.0f}s"
    )


def open_store(
    connect: Connect,
    *,
    what: str,
    deadline: float,
    stop: threading.Event,
    attempt_s: float = ATTEMPT_S,
    log_every: float = LOG_EVERY_S,
    hung_after: float = HUNG_AFTER_S,
    on_error: Callable[[str], None] | None = None,
) -> KVStore:
    """A connection from ``connect``; retried until ``deadline`` (monotonic, may be inf).

    Raises ``RendezvousInterruptedError`` within a poll of ``stop`` being set
    and ``StoreUnavailableError`` (naming the last error) at the deadline.
    ``what`` names the store and why we connect, for the log. ``on_error``
    gets each attempt's error as it comes (the agent's report shows it).
    """
    started = time.monotonic()
    next_log = started + log_every
    last_error = ""
    current: _Attempt | None = None
    left_behind: list[_Attempt] = []
    attempts = 0
    not_before = started
    try:
        while True:
            if stop.is_set():
                raise RendezvousInterruptedError(f"stopped while connecting to {what}")
            now = time.monotonic()
            if current is not None and current.done.is_set():
                if current.crash is not None:
                    raise current.crash
                if current.store is not None:
                    store, current.store = current.store, None
                    if attempts > 1:
                        log.info("connected to %s after %.1fs", what, now - started)
                    return store
                if not last_error:
                    log.warning(
                        "cannot reach %s yet: %s; retrying (%s)",
                        what,
                        current.error,
                        _until(deadline, now),
                    )
                last_error = current.error
                if on_error is not None:
                    on_error(last_error)
                not_before = current.started + _MIN_SPACING_S
                current = None
            elif current is not None and now - current.started >= hung_after:
                left_behind = [a for a in left_behind if not a.done.is_set()]
                if len(left_behind) < MAX_HUNG:
                    last_error = (
                        f"a connect attempt hung for {now - current.started:.0f}s "
                        "(the endpoint accepts but does not answer)"
                    )
                    left_behind.append(current)
                    current.give_up()
                    current = None
            if current is None and now < not_before:
                stop.wait(min(_POLL_S, not_before - now))
                continue
            if current is None:
                if now >= deadline:
                    raise StoreUnavailableError(
                        f"{what} unreachable for {now - started:.0f}s: {last_error or 'no answer'}"
                    )
                attempts += 1
                current = _Attempt(started=now)
                threading.Thread(
                    target=_run,
                    args=(connect, current, min(deadline, now + attempt_s)),
                    daemon=True,
                    name="store-connect",
                ).start()
            elif now >= deadline:
                raise StoreUnavailableError(
                    f"{what} unreachable for {now - started:.0f}s: "
                    f"{last_error or 'the connect attempt did not return'}"
                )
            if now >= next_log:
                log.warning(
                    "still connecting to %s after %.0fs (%s): %s",
                    what,
                    now - started,
                    _until(deadline, now),
                    last_error or "first attempt not answered yet",
                )
                next_log = now + log_every
            current.done.wait(_POLL_S)
    finally:
        if current is not None:
            current.give_up()
