"""Fixtures for the agent's integration tests: real store server and real etcd."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.agent.tfagent_helpers import start_etcd, start_store, stop_process


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
