"""Fixtures of the end-to-end scenarios: CRD, the real operator process, log follower.

Where it sits: ``tests/e2e/`` runs whole user stories on the local control
plane: the operator runs as its own process (``torchflex-operator``, the
console script), pods run on the process kubelet as real agents with real
torch workers (CPU, gloo), and assertions read training progress from the
workers' logs and checkpoints (``e2e.trainlog``), not only pod phases.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.cluster import Cluster
from e2e.operator_proc import OperatorProcess
from e2e.trainlog import LogFollower
from e2e.workload import apply_crd


@pytest.fixture(scope="session")
def crd(cluster: Cluster) -> None:
    apply_crd(cluster)


@pytest.fixture()
def operator_proc(cluster: Cluster, namespace: str, crd: None) -> Iterator[OperatorProcess]:
    log = cluster.layout.logs / f"operator-{namespace}.log"
    op = OperatorProcess(cluster.kubeconfig, [namespace], log).start()
    try:
        yield op
    finally:
        op.stop()
        print(f"--- operator log ({log}), last lines ---")
        print("\n".join(op.log_text().splitlines()[-40:]))


@pytest.fixture()
def follower(cluster: Cluster, namespace: str) -> Iterator[LogFollower]:
    with LogFollower(cluster.layout.pods, namespace) as f:
        yield f


@pytest.fixture()
def ckpt_dir(cluster: Cluster, namespace: str) -> Path:
    """A checkpoint directory every pod of the test mounts (hostPath)."""
    path = cluster.layout.root / "ckpt" / namespace
    path.mkdir(parents=True, exist_ok=True)
    return path
