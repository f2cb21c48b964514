"""The agent's store session: its connection and ``Rendezvous``, reconnected in one place.

Where it sits: ``loop.agent.ElasticAgent`` opens the store through a
``StoreSession`` at start-up (and once more, briefly, to mark the job failed
when its command cannot run) and calls ``reconnect`` whenever the store was
lost, during a rendezvous or while a round ran: the old connection closed, a
new one opened within the join timeout (SIGTERM ends the wait, exit 75), and a
fresh ``Rendezvous`` for the same node on it. Opening goes through
``loop.connecting.open_store`` (attempts on a thread, logged every 3 s); the
report's ``store_error`` says the store is lost until it answers again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from torchflex_agent.errors import StoreUnavailableError
from torchflex_agent.loop.connecting import Connect, open_store
from torchflex_agent.loop.logic.config import AgentConfig
from torchflex_agent.loop.supervise import AgentExitError
from torchflex_agent.rendezvous.logic import NodeDescriptor, RendezvousSettings
from torchflex_agent.rendezvous.protocol import Rendezvous, RendezvousInterruptedError
from torchflex_agent.stores.kvstore import KVStore
from torchflex_contract.exit_codes import ExitCode

log = logging.getLogger(__name__)


class StoreSession:
    """One store connection at a time and the ``Rendezvous`` on it."""

    def __init__(
        self,
        config: AgentConfig,
        connect: Connect,
        settings: RendezvousSettings,
        stop: threading.Event,
        update: Callable[..., None],
    ) -> None:
        """``stop``: SIGTERM; ``update``: changes fields of the agent's report."""
        self._config = config
        self._connect = connect
        self._settings = settings
        self._stop = stop
        self._update = update
        self._store: KVStore | None = None
        self._rdzv: Rendezvous | None = None

    @property
    def rdzv(self) -> Rendezvous:
        """The rendezvous on the current connection (``start`` first)."""
        assert self._rdzv is not None, "StoreSession.start was not called"
        return self._rdzv

    def open(self, why: str, timeout: float | None = None) -> KVStore:
        """Connect within ``timeout`` (default: the join timeout); SIGTERM ends it (exit 75)."""
        config = self._config
        deadline = time.monotonic() + (config.join_timeout if timeout is None else timeout)
        try:
            store = open_store(
                self._connect,
                what=f"{config.store_name} ({why})",
                deadline=deadline,
                stop=self._stop,
                on_error=lambda error: self._update(store_error=error),
            )
            self._update(store_error="")  # it answers again
            return store
        except RendezvousInterruptedError as exc:
            log.info("%s", exc)
            raise AgentExitError(ExitCode.PREEMPTED) from exc
        except StoreUnavailableError as exc:
            raise AgentExitError(ExitCode.INFRA_ERROR, str(exc)) from exc

    def rendezvous_on(self, store: KVStore, node: NodeDescriptor) -> Rendezvous:
        """A ``Rendezvous`` for ``node`` on ``store`` (a connection of this session's store)."""
        return Rendezvous(store, self._config.rdzv_key_id, node, self._settings)

    def start(self, node: Callable[[], NodeDescriptor]) -> Rendezvous:
        """Open the store, then join it as ``node()`` (called once the store answers)."""
        self._store = self.open("startup")
        self._rdzv = self.rendezvous_on(self._store, node())
        return self._rdzv

    def lost(self, when: str, exc: Exception) -> None:
        """Say that the store was lost ``when`` (the report's ``store_error``)."""
        log.warning("store lost %s: %s; reconnecting", when, exc)
        self._update(store_error=str(exc))

    def reconnect(self) -> Rendezvous:
        """After a store loss: close the connection, open a new one, rejoin as the same node."""
        node = self.rdzv.node
        if self._store is not None:
            self._store.close()
        self._store = self.open("reconnect")
        self._rdzv = self.rendezvous_on(self._store, node)
        return self._rdzv
