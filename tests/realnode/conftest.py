"""Fixtures of the real-node tier (issue 16): a kubelet with containerd,
runc and the CNI bridge plugin, joined to the session's local cluster.

Where it sits: only ``make test-real-nodes`` collects ``tests/realnode``
(``norecursedirs`` keeps ``make test`` and a bare ``pytest`` out of it, so
nothing here is ever skipped and counted as passed). The node is removed
at the end of the session unless ``TORCHFLEX_KEEP_CLUSTER`` keeps the
cluster, in which case a later session reuses both.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from e2e.cluster import Cluster
from e2e.realnode import RealNode, real_node_down, real_node_up


@pytest.fixture(scope="session")
def real_node(cluster: Cluster) -> Iterator[RealNode]:
    node = real_node_up(cluster)
    try:
        yield node
    finally:
        if not os.environ.get("TORCHFLEX_KEEP_CLUSTER"):
            real_node_down(cluster.layout.root, cluster)
