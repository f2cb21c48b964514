"""Fixtures shared by every test tier.

Where it sits: pytest loads this for ``tests/``. ``cluster`` starts the local
control plane once per session (or attaches to one named by
``TORCHFLEX_KUBECONFIG``, e.g. from ``make cluster``) and tears down only
what it started; ``namespace`` gives each test a fresh namespace and deletes
it afterwards. Unit tests never touch these fixtures.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e import hostfiles
from e2e.cluster import Cluster, ensure_up, tear_down
from e2e.cluster.layout import state_dir
from tests.support import fresh_namespace


def pytest_configure(config: pytest.Config) -> None:
    """Before any tier starts torch on the host: its peer-name lookups stay in /etc/hosts."""
    try:
        hostfiles.ensure_loopback_names()
    except hostfiles.HostSetupError as exc:
        raise pytest.UsageError(str(exc)) from exc


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    given = os.environ.get("TORCHFLEX_KUBECONFIG")
    if given:
        yield Cluster.from_kubeconfig(Path(given))
        return
    root = state_dir()  # .cluster/ or .cluster-N/ for TORCHFLEX_CLUSTER_SLOT=N
    was_up = (root / "cluster.json").exists()
    handle = ensure_up(root)
    try:
        yield handle
    finally:
        if not was_up and not os.environ.get("TORCHFLEX_KEEP_CLUSTER"):
            tear_down(root)


@pytest.fixture()
def namespace(cluster: Cluster) -> Iterator[str]:
    with fresh_namespace(cluster, "t") as name:
        yield name
