"""Each rendezvous backend as the agent meets it: its endpoint syntax and its store connection.

Where it sits: ``config`` parses ``--rdzv-endpoint`` with ``parse_endpoints``
and names the store in logs with ``describe``; ``cli`` asks the backend's
``opener`` for the ``connect`` function ``agent.ElasticAgent`` opens its store
with (through ``connecting.open_store``). The names are the contract's
``RendezvousBackend``; the operator's ``backends`` module is the other side of
the same name (what it runs and which endpoint it writes).

Like torch elastic's rendezvous registry, one entry per name and the client
module imported only when a connection is opened: parsing flags never imports
torch (``store_tcp``) or etcd3gw (``store_etcd``). Adding a backend is one
``AgentBackend`` below, its ``KVStore`` client module and their tests.
"""

from __future__ import annotations

import dataclasses
import re
import socket
from collections.abc import Callable, Mapping
from pathlib import Path

from torchflex_agent.errors import ConfigError, StoreUnavailableError
from torchflex_agent.kvstore import KVStore, MemoryStore
from torchflex_contract import env as tfenv
from torchflex_contract.rendezvous_backends import RendezvousBackend

Connect = Callable[[float], KVStore]
"""A new store connection, retrying until the given ``time.monotonic()`` deadline
(``connecting.Connect``; spelled here so that flag parsing imports no rendezvous code)."""


@dataclasses.dataclass(frozen=True)
class Endpoint:
    protocol: str
    host: str
    port: int


@dataclasses.dataclass(frozen=True)
class EndpointSyntax:
    """What ``--rdzv-endpoint`` holds for one backend."""

    default_port: int
    many: bool
    """A comma-separated list (several servers of one store) rather than one address."""
    schemes: tuple[str, ...]
    """URL schemes allowed in front of ``host[:port]`` (none: a bare address); when
    there are some, logs name each endpoint with its scheme."""


@dataclasses.dataclass(frozen=True)
class AgentBackend:
    name: RendezvousBackend
    syntax: EndpointSyntax | None
    """None: the backend takes no endpoint."""
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
        from torchflex_agent.store_tcp import connect_with_retry

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
        from torchflex_agent.store_etcd import connect_etcd_with_retry

        return connect_etcd_with_retry(urls, tls, deadline)

    return connect


def _open_memory(endpoints: tuple[Endpoint, ...], tls_dir: str | None) -> Connect:
    # One store per agent process; every connection is a clone sharing its data.
    shared = MemoryStore()
    return lambda deadline: shared.clone()


_BACKENDS: tuple[AgentBackend, ...] = (
    AgentBackend(
        RendezvousBackend.C10D,
        EndpointSyntax(tfenv.DEFAULT_STORE_PORT, many=False, schemes=()),
        _open_c10d,
    ),
    AgentBackend(
        RendezvousBackend.ETCD,
        EndpointSyntax(tfenv.DEFAULT_ETCD_PORT, many=True, schemes=("http", "https")),
        _open_etcd,
    ),
    AgentBackend(RendezvousBackend.MEMORY, None, _open_memory),
)
REGISTRY: Mapping[RendezvousBackend, AgentBackend] = {b.name: b for b in _BACKENDS}
NAMES: tuple[str, ...] = tuple(b.name.value for b in _BACKENDS)
"""What ``--rdzv-backend`` accepts, in the order its help and errors list them."""


def backend(name: str) -> AgentBackend:
    """The backend named ``name``; ``ConfigError`` naming the flag for an unknown one."""
    if name not in NAMES:
        raise ConfigError(f"--rdzv-backend: expected one of {', '.join(NAMES)}, got {name!r}")
    return REGISTRY[RendezvousBackend(name)]


_HOSTPORT = re.compile(
    r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9_.-]+))(?::(?P<port>\d+))?$"
)


def parse_endpoints(text: str, name: str) -> tuple[Endpoint, ...]:
    """``host[:port]`` for c10d; comma-separated ``[http[s]://]host[:port]`` for etcd."""
    syntax = backend(name).syntax
    if syntax is None:
        return ()
    if not text:
        raise ConfigError(f"--rdzv-endpoint: required for the {name} backend")
    items = [t.strip() for t in text.split(",")] if syntax.many else [text.strip()]
    out = []
    for item in items:
        protocol = "http"
        rest = item
        if "://" in item:
            protocol, rest = item.split("://", 1)
            if protocol not in syntax.schemes:
                raise ConfigError(f"--rdzv-endpoint: unsupported scheme in {item!r}")
        m = _HOSTPORT.match(rest.rstrip("/"))
        if m is None:
            raise ConfigError(f"--rdzv-endpoint: expected host[:port], got {item!r}")
        port = int(m.group("port")) if m.group("port") else syntax.default_port
        if not 0 < port < 65536:
            raise ConfigError(f"--rdzv-endpoint: port out of range in {item!r}")
        out.append(Endpoint(protocol, m.group("v6") or m.group("host"), port))
    return tuple(out)


def describe(name: str, endpoints: tuple[Endpoint, ...]) -> str:
    """The rendezvous store as logs name it: backend and endpoints."""
    syntax = backend(name).syntax
    if syntax is not None and syntax.schemes:
        where = ",".join(f"{e.protocol}://{e.host}:{e.port}" for e in endpoints)
    else:
        where = ",".join(f"{e.host}:{e.port}" for e in endpoints)
    return f"the {name} rendezvous store {where}".rstrip()
