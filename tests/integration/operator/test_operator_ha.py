"""Two real operator processes electing a leader on a Lease: one acts, the other
stands by passively (no write), and takes over when the active one is SIGKILLed.

The processes are ``torchflex-operator`` itself (console script, flags,
kubeconfig; ``e2e.operator_proc.OperatorProcess``), each with its own metrics
endpoint on loopback, which is how the test tells what each one did. Only
processes this test started are signalled, by PID.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import Cluster
from e2e.localproc import free_port
from e2e.operator_proc import OperatorProcess
from tests.integration.operator.jobs import apply, kwok_job, live_workers
from tests.support import wait_for

pytestmark = pytest.mark.cluster
LEASE = "torchflex"
LEASE_S = 6
WRITES = ("create", "patch", "delete", "post")


class Replica(OperatorProcess):
    """One of the replicas, electing on the Lease as ``identity`` (``$POD_ID``); started."""

    def __init__(self, cluster: Cluster, namespace: str, identity: str, log: Path) -> None:
        lease = ["--lease", LEASE, "--lease-namespace", namespace,
                 "--lease-duration", str(LEASE_S)]  # fmt: skip
        super().__init__(
            cluster.kubeconfig,
            [namespace],
            log,
            [*lease, "--agent-command", "env", "--no-agent-status-poll"],
            standalone=False,
            tuning=("--backoff-base", "0.2", "--backoff-cap", "2"),
            metrics_port=free_port(),
            env={"POD_ID": identity},
        )
        self.identity = identity
        self.start()

    def metrics(self) -> dict[str, float]:
        """Samples of our metrics, ``name{labels}`` -> value; {} while not serving."""
        try:
            url = f"http://127.0.0.1:{self.metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=2) as rsp:
                text = rsp.read().decode()
        except OSError:
            return {}
        out = {}
        for line in text.splitlines():
            if line.startswith("torchflex_"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def total(self, prefix: str) -> float:
        return sum(v for k, v in self.metrics().items() if k.startswith(prefix))

    def writes(self) -> float:
        # Each write verb's series, whatever their status codes (the exposition sorts
        # the labels: code="...",verb="...").
        series = "torchflex_api_requests_total{"
        verbs = tuple(f'verb="{v}"' for v in WRITES)
        samples = self.metrics().items()
        return sum(v for k, v in samples if k.startswith(series) and any(w in k for w in verbs))

    def active(self) -> bool:
        return self.metrics().get("torchflex_active") == 1.0


@pytest.fixture()
def replicas(
    cluster: Cluster, namespace: str, crd: None, tmp_path: Path
) -> Iterator[list[Replica]]:
    started: list[Replica] = []
    try:
        yield started
    finally:
        for replica in started:
            replica.stop(grace_s=15)


def lease(cluster: Cluster, namespace: str) -> dict[str, Any]:
    """The Lease's spec; {} while it does not exist."""
    out = cluster.kubectl("get", "lease", LEASE, "-n", namespace, "-o", "json", check=False)
    return dict(json.loads(out.stdout)["spec"]) if out.returncode == 0 else {}


def test_only_the_active_replica_acts_and_the_standby_takes_over(
    cluster: Cluster, namespace: str, replicas: list[Replica], tmp_path: Path
) -> None:
    cluster.kwok_nodes(2, prefix="op-kwok")
    first = Replica(cluster, namespace, "op-first", tmp_path / "first.log")
    replicas.append(first)
    wait_for(first.active, 60, "the first replica active")
    assert lease(cluster, namespace)["holderIdentity"] == "op-first"
    second = Replica(cluster, namespace, "op-second", tmp_path / "second.log")
    replicas.append(second)
    wait_for(second.metrics, 30, "the second replica serving metrics")
    # The replica that came later never pre-empts the one that holds the Lease.
    held = f"Lease {namespace}/{LEASE} is held by op-first"
    wait_for(lambda: held in second.log_text(), 30, "the second replica standing by")
    assert lease(cluster, namespace)["holderIdentity"] == "op-first"

    name = "ha"
    apply(cluster, namespace, kwok_job(name, minReplicas=1, maxReplicas=3, replicas=2))
    wait_for(lambda: len(live_workers(cluster, namespace, name)) == 2, 60, "2 workers")
    time.sleep(2 * LEASE_S)  # past a lease duration or two: the standby stays passive
    assert first.active() and not second.active()
    assert lease(cluster, namespace)["holderIdentity"] == "op-first"
    assert first.total("torchflex_pods_created_total") >= 3  # 2 workers + the store
    assert second.total("torchflex_pods_created_total") == 0
    assert second.total("torchflex_reconcile_total") == 0
    assert second.writes() == 0, second.metrics()
    assert first.writes() > 0

    # The active replica dies without releasing the Lease; it expires.
    killed_at = time.monotonic()
    first.kill()
    wait_for(second.active, 4 * LEASE_S, "the standby active")
    took_over = time.monotonic() - killed_at
    assert took_over <= 4 * LEASE_S
    spec = lease(cluster, namespace)
    assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("op-second", 1)
    cluster.kubectl("scale", "-n", namespace, f"ej/{name}", "--replicas=3")
    wait_for(lambda: len(live_workers(cluster, namespace, name)) == 3, 60, "3 workers")
    # The operator counts a pod once the API server's answer reaches it: kubectl may
    # list the pod a moment before that (seen on a loaded machine).
    created = "torchflex_pods_created_total"
    wait_for(lambda: second.total(created) >= 1, 15, "the new worker counted")
    assert second.total(created) == 1  # only the new worker
    indices = sorted(live_workers(cluster, namespace, name))
    assert indices == [f"{name}-worker-{i}" for i in range(3)]
