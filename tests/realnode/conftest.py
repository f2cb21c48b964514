"""Fixtures of the real-node tier (issue 16): a kubelet with containerd,
runc and the CNI bridge plugin, joined to the session's local cluster.

Where it sits: a tier of ``make test`` (and so of CI), after its setup
``build.sh --real-nodes`` (``make real-node-toolchain``); ``make
test-real-nodes`` runs it alone. Nothing here is skipped when a part is
missing: a test fails. The node is removed at the end of the session
unless ``TORCHFLEX_KEEP_CLUSTER`` keeps the cluster, in which case a later
session reuses both.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from e2e.cluster import Cluster
from e2e.realnode import RealNode, real_node_down, real_node_up
from e2e.realnode.imagebuild import PushedImage, base_rootfs, build_agent_image, operator_image
from e2e.realnode.node import realnode_bin_dir
from e2e.realnode.registry import ImagesPaths, registry_up

# The install tests' Helm release (cleaned up even when a test fails), reused as is.
from tests.integration.install.conftest import release  # noqa: F401


@pytest.fixture(scope="session")
def real_node(cluster: Cluster) -> Iterator[RealNode]:
    node = real_node_up(cluster)
    try:
        yield node
    finally:
        if not os.environ.get("TORCHFLEX_KEEP_CLUSTER"):
            real_node_down(cluster.layout.root, cluster)


@pytest.fixture(scope="session")
def registry_address(cluster: Cluster, real_node: RealNode) -> str:
    """The slot's local registry on loopback, known to the node's containerd
    (stopped with the real node, by ``real_node_down``)."""
    return registry_up(realnode_bin_dir(), ImagesPaths.of(cluster.layout.root), real_node.paths)


def _report(name: str, image: PushedImage) -> PushedImage:
    print(
        f"{name} image {image.reference}: {image.local_size} stored, "
        f"{image.pushed_bytes / 1e6:.1f} MB pushed; base import {image.base_s:.1f}s, "
        f"build {image.build_s:.1f}s, push {image.push_s:.1f}s"
    )
    return image


@pytest.fixture(scope="session")
def operator_pushed(cluster: Cluster, registry_address: str) -> PushedImage:
    """docker/operator.Dockerfile built by buildah on the Debian base, pushed there."""
    images, rootfs = ImagesPaths.of(cluster.layout.root), base_rootfs(realnode_bin_dir())
    return _report("operator", operator_image(images, rootfs, registry_address))


@pytest.fixture(scope="session")
def agent_pushed(cluster: Cluster, registry_address: str) -> PushedImage:
    """docker/agent.Dockerfile (torch from PyPI) built by buildah on the Debian base, pushed."""
    images, rootfs = ImagesPaths.of(cluster.layout.root), base_rootfs(realnode_bin_dir())
    return _report("agent", build_agent_image(images, rootfs, registry_address))
