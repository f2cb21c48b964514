"""Table tests of the agent's backend registry: one entry per contract name (in the
openers of ``backends`` and the endpoint syntax of ``endpoints``), each backend's
endpoint syntax and log name, and the in-memory store's connections.

The c10d and etcd connections are opened against real servers in
tests/integration/agent/test_agent_backends_open.py.
"""

from __future__ import annotations

import pytest

from torchflex_agent.errors import ConfigError
from torchflex_agent.stores import logic as endpoints
from torchflex_agent.stores import registry as backends
from torchflex_agent.stores.logic import Endpoint, parse_endpoints
from torchflex_contract.rendezvous_backends import RendezvousBackend


def test_every_contract_name_has_one_agent_backend_in_the_contracts_order() -> None:
    assert list(backends.REGISTRY) == list(RendezvousBackend)
    assert all(name is entry.name for name, entry in backends.REGISTRY.items())
    assert list(endpoints.SYNTAX) == list(RendezvousBackend)
    assert endpoints.NAMES == ("c10d", "etcd", "memory")


def test_an_unknown_name_is_a_config_error_naming_the_flag_and_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"--rdzv-backend: expected one of c10d, etcd, memory"):
        backends.backend("zk")


@pytest.mark.parametrize(
    ("text", "backend", "expected"),
    [
        ("store", "c10d", (Endpoint("http", "store", 29400),)),
        ("a.b-c:1234", "c10d", (Endpoint("http", "a.b-c", 1234),)),
        ("", "memory", ()),
        ("http://a:1, https://b", "etcd", (Endpoint("http", "a", 1), Endpoint("https", "b", 2379))),
    ],
)
def test_parse_endpoints(text: str, backend: str, expected: tuple[Endpoint, ...]) -> None:
    assert parse_endpoints(text, backend) == expected


@pytest.mark.parametrize(
    ("backend", "text", "expected"),
    [
        # Default port: the store pod's for c10d, etcd's client port for etcd.
        ("c10d", "h", (Endpoint("http", "h", 29400),)),
        ("etcd", "h", (Endpoint("http", "h", 2379),)),
        # A list only where the backend takes several servers.
        ("etcd", "a:1,b:2", (Endpoint("http", "a", 1), Endpoint("http", "b", 2))),
        ("etcd", "https://[::1]:5/", (Endpoint("https", "::1", 5),)),
        # memory takes no endpoint: whatever is given is ignored.
        ("memory", "anything:1", ()),
    ],
)
def test_endpoint_syntax_per_backend(
    backend: str, text: str, expected: tuple[Endpoint, ...]
) -> None:
    assert parse_endpoints(text, backend) == expected


@pytest.mark.parametrize(
    ("backend", "text", "message"),
    [
        ("c10d", "", "required for the c10d backend"),
        ("etcd", "", "required for the etcd backend"),
        ("c10d", "a:1,b:2", "expected host\\[:port\\]"),
        ("c10d", "http://h:1", "unsupported scheme"),
        ("etcd", "ftp://h:1", "unsupported scheme"),
        ("etcd", "h:0", "port out of range"),
    ],
)
def test_endpoint_errors_per_backend(backend: str, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=f"--rdzv-endpoint: {message}"):
        parse_endpoints(text, backend)


@pytest.mark.parametrize(
    ("backend", "eps", "name"),
    [
        ("c10d", (Endpoint("http", "s", 29400),), "the c10d rendezvous store s:29400"),
        (
            "etcd",
            (Endpoint("http", "e", 2379), Endpoint("https", "f", 1)),
            "the etcd rendezvous store http://e:2379,https://f:1",
        ),
        ("memory", (), "the memory rendezvous store"),
    ],
)
def test_store_name_in_logs(backend: str, eps: tuple[Endpoint, ...], name: str) -> None:
    assert endpoints.describe(backend, eps) == name


def test_memory_connections_of_one_opener_share_one_store_and_openers_do_not() -> None:
    opener = backends.backend("memory").opener
    connect = opener((), None)
    a, b = connect(0.0), connect(0.0)
    a.set("k", b"v")
    assert b.get("k") == b"v"
    assert opener((), None)(0.0).get("k") is None
