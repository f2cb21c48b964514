"""Fixtures of the operator's integration tests: the CRD, and the operator in-process.

The operator runs with kopf's ``KopfRunner`` in a thread of the test process,
against the real local control plane (``cluster`` fixture), restricted to the
test's namespace. Its settings make backoff short so tests stay quick.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest
from kopf.testing import KopfRunner

from e2e.cluster import Cluster
from e2e.workload import apply_crd
from torchflex_operator.kube import Kube
from torchflex_operator.model.settings import Settings
from torchflex_operator.runtime.agent_status import StatusPoller
from torchflex_operator.runtime.handlers import register
from torchflex_operator.runtime.metrics import Metrics
from torchflex_operator.runtime.reconcile import Reconciler

# Pods on the process node run their command for real. ``env --`` stands in
# for ``torchflex-agent --`` so these tests exercise the operator alone (the
# agent has its own tests); it runs the training command unchanged.
TEST_SETTINGS = Settings(
    agent_command="env",
    backoff_base_s=0.2,
    backoff_cap_s=2.0,
    resync_s=5.0,
    force_delete_after_s=5.0,
)


@pytest.fixture(scope="session")
def crd(cluster: Cluster) -> None:
    apply_crd(cluster)


@contextlib.contextmanager
def run_operator(
    cluster: Cluster,
    namespace: str,
    *,
    settings: Settings = TEST_SETTINGS,
    poller: StatusPoller | None = None,
) -> Iterator[Reconciler]:
    """One operator incarnation; leaving the block stops it (like a pod restart).

    ``reconciler.metrics.api_requests`` counts every request it sends.
    """
    metrics = Metrics()
    kube = Kube(cluster.api_client(), on_request=metrics.api_request)
    reconciler = Reconciler(
        kube, settings, poller=poller or StatusPoller(enabled=False), metrics=metrics
    )
    registry = register(reconciler)
    args = ["run", "--standalone", "--namespace", namespace]
    with KopfRunner(args, registry=registry, timeout=60) as runner:
        yield reconciler
    assert runner.exception is None, runner.output
    assert runner.exit_code == 0, runner.output


@pytest.fixture()
def kubeconfig_env(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf logs in from the environment's kubeconfig."""
    monkeypatch.setitem(os.environ, "KUBECONFIG", str(cluster.kubeconfig))


@pytest.fixture()
def operator(
    cluster: Cluster, namespace: str, crd: None, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Reconciler]:
    # kopf logs in from the environment's kubeconfig.
    monkeypatch.setitem(os.environ, "KUBECONFIG", str(cluster.kubeconfig))
    with run_operator(cluster, namespace) as reconciler:
        yield reconciler
