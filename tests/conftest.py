"""Fixtures shared by every test tier.

Where it sits: pytest loads this for ``tests/``. ``cluster`` starts the local
control plane once per session (or attaches to one named by
``TORCHFLEX_KUBECONFIG``, e.g. from ``make cluster``) and tears down only
what it started; ``namespace`` gives each test a fresh namespace and deletes
it afterwards. Unit tests never touch these fixtures.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.cluster import Cluster, ensure_up, tear_down
from e2e.cluster.layout import state_dir
from tests.support import wait_for


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
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    # Pods are refused until the ServiceAccount controller made "default".
    wait_for(
        lambda: cluster.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0,
        30,
        f"default ServiceAccount in {name}",
    )
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
