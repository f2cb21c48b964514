"""Each rendezvous backend as the agent meets it: how its store connection is opened.

Where it sits: ``cli`` asks the backend's ``opener`` for the ``connect``
function ``loop.agent.ElasticAgent`` opens its store with (through
``loop.connecting.open_store``), given the endpoints ``loop.logic.config`` parsed with the
backend's syntax in ``stores.logic`` (pure, so flag parsing reaches no store
client: that module holds the syntax, this one the connections). The names
are the contract's ``RendezvousBackend``; the operator's ``stores.registry`` module
is the other side of the same name (what it runs and which endpoint it writes).

Like torch elastic's rendezvous registry, one entry per name and the client
module imported only when a connection is opened: starting the agent never
imports torch (``stores.tcp``) or etcd3gw (``stores.etcd``) before it connects.
Adding a backend is one ``AgentBackend`` below, its ``stores.logic.SYNTAX``
entry, its ``KVStore`` client module and their tests.
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Callable, Mapping
from pathlib import Path

from torchflex_agent.errors import StoreUnavailableError
from torchflex_agent.stores.kvstore import KVStore, MemoryStore
from torchflex_agent.stores.logic import Endpoint, backend_name
from torchflex_contract.rendezvous_backends import RendezvousBackend

Connect = Callable[[float], KVStore]
"""A new store connection, retrying until the given ``time.monotonic()`` deadline
(``loop.connecting.Connect``; spelled here so that flag parsing imports no rendezvous code)."""


@dataclasses.dataclass(frozen=True)
class AgentBackend:
    name: RendezvousBackend
    opener: Callable[[tuple[Endpoint, ...], str | None], Connect]
    """(parsed endpoints, ``--rdzv-tls-dir``) -> the agent's ``connect``."""


def tcp_cause(host: str, port: int, timeout: float = 1.0) -> str:
    """What a plain TCP connect to the store sees: refused, timed out, no such host, or fine."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return "TCP connect works: the store accepts but does not answer"
    except TimeoutError:
        return f"TCP connect: no answer within {timeout:g}s"
    except OSError as exc:
        return f"TCP connect: {exc.strerror or exc}"


def _open_c10d(endpoints: tuple[Endpoint, ...], tls_dir: str | None) -> Connect:
    ep = endpoints[0]

    def connect(deadline: float) -> KVStore:
        from torchflex_agent.stores.tcp import connect_with_retry

        try:
            return connect_with_retry(ep.host, ep.port, deadline)
        except StoreUnavailableError as exc:
            # c10d says only "timed out ... while trying to connect"; say why.
            raise StoreUnavailableError(f"{exc} ({tcp_cause(ep.host, ep.port)})") from exc

    return connect


def _open_etcd(endpoints: tuple[Endpoint, ...], tls_dir: str | None) -> Connect:
    tls = None
    if tls_dir:
        d = Path(tls_dir)
        tls = (str(d / "ca.crt"), str(d / "tls.crt"), str(d / "tls.key"))
    urls = [(ep.protocol if tls is None else "https", ep.host, ep.port) for ep in endpoints]

    def connect(deadline: float) -> KVStore:
        from torchflex_agent.stores.etcd import connect_etcd_with_retry

        return connect_etcd_with_retry(urls, tls, deadline)

    return connect


def _open_memory(endpoints: tuple[Endpoint, ...], tls_dir: str | None) -> Connect:
    # One store per agent process; every connection is a clone sharing its data.
    shared = MemoryStore()
    return lambda deadline: shared.clone()


_BACKENDS: tuple[AgentBackend, ...] = (
    AgentBackend(RendezvousBackend.C10D, _open_c10d),
    AgentBackend(RendezvousBackend.ETCD, _open_etcd),
    AgentBackend(RendezvousBackend.MEMORY, _open_memory),
)
REGISTRY: Mapping[RendezvousBackend, AgentBackend] = {b.name: b for b in _BACKENDS}


def backend(name: str) -> AgentBackend:
    """The backend named ``name``; ``ConfigError`` naming the flag for an unknown one."""
    return REGISTRY[backend_name(name)]
