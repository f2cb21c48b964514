"""The job's PodDisruptionBudget against a real API server's Eviction API.

Pods run on kwok's fake nodes (Running and Ready without processes): what is
checked is the budget the operator writes and what the Eviction API does with
it, the way a drain (cluster-autoscaler, ``kubectl drain``, a node
termination handler) meets it. The autoscaler itself: tests/e2e/test_autoscaler.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client

from e2e.cluster import Cluster
from tests.integration.operator.jobs import apply, get_job, kwok_job, patch_spec, pods
from tests.support import wait_for
from torchflex_contract import labels
from torchflex_operator.model.vocabulary import AutoscalerAnnotation
from torchflex_operator.runtime.reconcile import Reconciler

pytestmark = pytest.mark.cluster
TOO_MANY_REQUESTS = 429


def budget(cluster: Cluster, ns: str, name: str) -> dict[str, Any] | None:
    # One read: a second one could miss a budget deleted in between.
    out = cluster.kubectl("get", "pdb", name, "-n", ns, "-o", "json", check=False)
    if out.returncode != 0:
        return None
    pdb: dict[str, Any] = json.loads(out.stdout)
    return pdb


def settled(cluster: Cluster, ns: str, name: str, min_available: int, allowed: int) -> bool:
    """The disruption controller has seen this spec and counts every worker healthy."""
    pdb = budget(cluster, ns, name)
    if pdb is None or pdb["spec"]["minAvailable"] != min_available:
        return False
    status = pdb.get("status") or {}
    return (
        status.get("observedGeneration") == pdb["metadata"]["generation"]
        and status.get("currentHealthy") == min_available + allowed
        and status.get("disruptionsAllowed") == allowed
    )


def evict(cluster: Cluster, ns: str, pod: str) -> int:
    """The Eviction API's answer: 201 evicted, 429 refused by a budget."""
    api = client.CoreV1Api(cluster.api_client())
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod, namespace=ns))
    try:
        api.create_namespaced_pod_eviction(pod, ns, body)
    except client.ApiException as exc:
        return int(exc.status)
    return 201


def test_evictions_stop_at_min_replicas_and_follow_it(
    cluster: Cluster, namespace: str, operator: Reconciler
) -> None:
    cluster.kwok_nodes(2, prefix="pdb-kwok")
    name = "pdb"
    apply(cluster, namespace, kwok_job(name, minReplicas=2, maxReplicas=2))
    wait_for(lambda: settled(cluster, namespace, name, 2, 0), 90, "budget of 2, 2 healthy")

    pdb = budget(cluster, namespace, name)
    assert pdb is not None
    (owner,) = pdb["metadata"]["ownerReferences"]
    assert owner["uid"] == get_job(cluster, namespace, name)["metadata"]["uid"]
    safe = AutoscalerAnnotation.SAFE_TO_EVICT.value
    assert all(p["metadata"]["annotations"][safe] == "true" for p in pods(cluster, namespace, name))
    (store,) = pods(cluster, namespace, name, labels.PodKind.STORE)
    assert store["metadata"]["annotations"][safe] == "false"

    # At its minimum, the job loses no worker to a drain.
    assert evict(cluster, namespace, f"{name}-worker-1") == TOO_MANY_REQUESTS

    # minReplicas 1: the budget follows, one worker may go.
    patch_spec(cluster, namespace, name, minReplicas=1)
    wait_for(lambda: settled(cluster, namespace, name, 1, 1), 120, "budget of 1, 2 healthy")
    # The new minimum rolls the workers (their env names it: NNODES): a worker being
    # replaced answers 404, a replacement not yet healthy 429. The budget lets one go
    # only once it counts 2 healthy over a minimum of 1 (with the old minimum of 2 it
    # never would: at most 2 workers exist), so wait for that eviction to succeed.
    answers: list[int] = []

    def evicted() -> bool:
        answers.append(evict(cluster, namespace, f"{name}-worker-1"))
        return answers[-1] == 201

    wait_for(evicted, 60, f"a worker evicted under the new budget (answers {answers[-5:]})", 1.0)
    assert set(answers) <= {201, 404, TOO_MANY_REQUESTS}, answers
