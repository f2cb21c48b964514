"""Fixtures for the agent's integration tests: real store server, real etcd,
``backend``, which runs a test once per ``KVStore`` implementation, and
``job``, a store and agents as real processes (``tfagent_helpers.Job``)."""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from e2e.localproc import stop_process
from tests.integration.agent.tfagent_helpers import Job, start_etcd, start_store
from torchflex_agent.stores.kvstore import KVStore, MemoryStore


@dataclasses.dataclass
class Backend:
    """One store backend: how to open a new connection to it."""

    name: str
    connect: Callable[[], KVStore]
    port: int = 0


@pytest.fixture()
def job(tmp_path: Path) -> Iterator[Job]:
    """A job's processes (store, etcd, agents), all stopped by PID afterwards."""
    with Job(tmp_path) as j:
        yield j


@pytest.fixture(scope="module")
def store_server() -> Iterator[int]:
    """A ``torchflex-agent store`` process; yields its port."""
    proc, port, _log = start_store()
    try:
        yield port
    finally:
        stop_process(proc)


@pytest.fixture(scope="module")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A real etcd on 127.0.0.1; yields its client port."""
    proc: subprocess.Popen[bytes]
    proc, port = start_etcd(Path(tmp_path_factory.mktemp("etcd")))
    try:
        yield port
    finally:
        stop_process(proc)


@pytest.fixture(params=["memory", "c10d", "etcd"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """The in-memory fake, a real c10d store process and a real etcd, in turn."""
    if request.param == "memory":
        shared = MemoryStore()
        yield Backend("memory", shared.clone)
    elif request.param == "c10d":
        from torchflex_agent.stores.tcp import TCPKVStore

        port = request.getfixturevalue("store_server")
        # The contract is about what the rendezvous decides, not the client's 2 s
        # per-call deadline (tested with frozen stores elsewhere): on a loaded
        # machine a slow reply must not turn a MemberLeft into StoreLost here.
        yield Backend("c10d", lambda: TCPKVStore("127.0.0.1", port, op_timeout=10.0), port)
    else:
        from torchflex_agent.stores.etcd import EtcdKVStore

        port = request.getfixturevalue("etcd_server")
        yield Backend("etcd", lambda: EtcdKVStore([("http", "127.0.0.1", port)]), port)
