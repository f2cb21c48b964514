"""Each rendezvous backend's ``--rdzv-endpoint`` syntax and its name in logs (pure).

Where it sits: ``loop.logic.config`` checks ``--rdzv-backend`` with :func:`backend_name`,
parses ``--rdzv-endpoint`` with :func:`parse_endpoints` and names the store
in logs with :func:`describe`; ``stores.registry`` pairs each name with the opener
of its store connection. The split keeps flag parsing pure: this module
imports no store client, no socket and no clock (an import-linter contract
in pyproject.toml holds ``loop.logic.config`` and this module to it), while the openers
in ``stores.registry`` reach the client modules.

One :data:`SYNTAX` entry per contract name (``RendezvousBackend``), in the
contract's order; ``tests/unit/agent/test_agent_backends.py`` fails while
this table and the openers' disagree on the names.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from torchflex_agent.errors import ConfigError
from torchflex_contract import env as tfenv
from torchflex_contract.rendezvous_backends import RendezvousBackend


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


SYNTAX: Mapping[RendezvousBackend, EndpointSyntax | None] = {
    RendezvousBackend.C10D: EndpointSyntax(tfenv.DEFAULT_STORE_PORT, many=False, schemes=()),
    RendezvousBackend.ETCD: EndpointSyntax(
        tfenv.DEFAULT_ETCD_PORT, many=True, schemes=("http", "https")
    ),
    RendezvousBackend.MEMORY: None,  # takes no endpoint
}
NAMES: tuple[str, ...] = tuple(name.value for name in SYNTAX)
"""What ``--rdzv-backend`` accepts, in the order its help and errors list them."""


def backend_name(name: str) -> RendezvousBackend:
    """The backend named ``name``; ``ConfigError`` naming the flag for an unknown one."""
    if name not in NAMES:
        raise ConfigError(f"--rdzv-backend: expected one of {', '.join(NAMES)}, got {name!r}")
    return RendezvousBackend(name)


_HOSTPORT = re.compile(
    r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9_.-]+))(?::(?P<port>\d+))?$"
)


def parse_endpoints(text: str, name: str) -> tuple[Endpoint, ...]:
    """``host[:port]`` for c10d; comma-separated ``[http[s]://]host[:port]`` for etcd."""
    syntax = SYNTAX[backend_name(name)]
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
    syntax = SYNTAX[backend_name(name)]
    if syntax is not None and syntax.schemes:
        where = ",".join(f"{e.protocol}://{e.host}:{e.port}" for e in endpoints)
    else:
        where = ",".join(f"{e.host}:{e.port}" for e in endpoints)
    return f"the {name} rendezvous store {where}".rstrip()
