"""Fixtures of the install tests: a Helm release in its own namespace, extra
namespaces for jobs, and cleanup of both even when a test fails."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest

from e2e.cluster import Cluster
from tests.integration.install.release import Release
from tests.support import wait_for


@pytest.fixture()
def release(cluster: Cluster, namespace: str) -> Iterator[Release]:
    rel = Release(cluster, namespace)
    try:
        yield rel
    finally:
        rel.close()


@pytest.fixture()
def make_namespace(cluster: Cluster, release: Release) -> Iterator[Callable[[], str]]:
    made: list[str] = []

    def make() -> str:
        name = f"t-{uuid.uuid4().hex[:8]}"
        cluster.kubectl("create", "namespace", name)
        made.append(name)
        release.own_namespaces.add(name)
        wait_for(
            lambda: (
                cluster.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0
            ),
            30,
            f"default ServiceAccount in {name}",
        )
        return name

    yield make
    for name in made:
        # Jobs first, so no operator of a later test picks them up while the namespace goes.
        cluster.kubectl("delete", "elasticjobs", "--all", "-n", name, "--wait=false", check=False)
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
