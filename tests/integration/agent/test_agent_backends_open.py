"""The agent's backend registry opens real stores.

Each backend's ``opener``, given its parsed ``--rdzv-endpoint``, connects to
a real c10d store process and a real etcd on 127.0.0.1 (the in-memory one is
tests/unit/agent/test_agent_backends.py), and an unreachable c10d store's
error says what a plain TCP connect sees.
"""

from __future__ import annotations

import time
import uuid

import pytest

from e2e.localproc import free_port
from torchflex_agent.errors import StoreUnavailableError
from torchflex_agent.stores import registry as backends
from torchflex_agent.stores.kvstore import KVStore
from torchflex_agent.stores.logic import parse_endpoints


def _direct(name: str, port: int) -> KVStore:
    """A connection opened the tests' own way, not through the registry."""
    if name == "c10d":
        from torchflex_agent.stores.tcp import TCPKVStore

        return TCPKVStore("127.0.0.1", port)
    from torchflex_agent.stores.etcd import EtcdKVStore

    return EtcdKVStore([("http", "127.0.0.1", port)])


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("name", "server", "endpoint"),
    [
        ("c10d", "store_server", "127.0.0.1:{port}"),
        ("etcd", "etcd_server", "http://127.0.0.1:{port}"),
    ],
)
def test_opener_connects_to_the_real_store(
    name: str, server: str, endpoint: str, request: pytest.FixtureRequest
) -> None:
    port = request.getfixturevalue(server)
    endpoints = parse_endpoints(endpoint.format(port=port), name)
    connect = backends.backend(name).opener(endpoints, None)
    ours, theirs = connect(time.monotonic() + 20.0), _direct(name, port)
    key = f"/backends-open/{uuid.uuid4().hex[:10]}"
    try:
        ours.set(key, b"written through the opener")
        # torch's TCPStore sends a set without awaiting a reply: only a round trip on the
        # same connection orders it before another connection's read (as the rendezvous
        # does: a set, then an add, before peers look).
        assert ours.get(key) == b"written through the opener"
        assert theirs.get(key) == b"written through the opener"
    finally:
        ours.close()
        theirs.close()


@pytest.mark.timeout(60)
def test_unreachable_c10d_store_names_the_tcp_cause() -> None:
    port = free_port()  # nothing listens there
    endpoints = parse_endpoints(f"127.0.0.1:{port}", "c10d")
    connect = backends.backend("c10d").opener(endpoints, None)
    with pytest.raises(StoreUnavailableError, match=r"\(TCP connect: Connection refused\)"):
        connect(time.monotonic() + 1.0)
