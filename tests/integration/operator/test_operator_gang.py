"""The job's PodGroup against a real API server and scheduler with the Workload API on.

The local control plane serves ``scheduling.k8s.io/v1beta1`` and runs the
scheduler's GangScheduling plugin (``e2e/cluster/controlplane.py``). Pods run
on kwok's fake nodes: what is checked is the objects and the scheduler's
placement, not training (the deadlock the gang prevents is
tests/e2e/test_gang.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from e2e.cluster import Cluster
from tests.integration.operator.jobs import apply, get_job, kwok_job, patch_spec, pods
from tests.support import wait_for
from torchflex_contract import labels
from torchflex_operator.runtime.reconcile import Reconciler

pytestmark = pytest.mark.cluster


def pod_group(cluster: Cluster, ns: str, name: str) -> dict[str, Any] | None:
    # One read: a second one could miss a group deleted in between (seen in CI).
    out = cluster.kubectl("get", "podgroups.scheduling.k8s.io", name, "-n", ns, "-o", "json",
                          check=False)  # fmt: skip
    if out.returncode != 0:
        return None
    group: dict[str, Any] = json.loads(out.stdout)
    return group


def min_count(group: dict[str, Any] | None) -> int | None:
    if group is None:
        return None
    return int(group["spec"]["schedulingPolicy"]["gang"]["minCount"])


def bound(cluster: Cluster, ns: str, name: str) -> list[str]:
    return [p["metadata"]["name"] for p in pods(cluster, ns, name) if p["spec"].get("nodeName")]


def test_job_owns_a_gang_of_its_minimum_that_follows_the_spec(
    cluster: Cluster, namespace: str, operator: Reconciler
) -> None:
    cluster.kwok_nodes(2, prefix="gang-kwok")
    name = "gang"
    apply(cluster, namespace, kwok_job(name, minReplicas=2, maxReplicas=4, replicas=2))
    wait_for(lambda: len(bound(cluster, namespace, name)) == 2, 60, "2 workers placed")

    group = pod_group(cluster, namespace, name)
    assert group is not None and min_count(group) == 2
    job = get_job(cluster, namespace, name)
    (owner,) = group["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == (labels.KIND, job["metadata"]["uid"])
    assert job["status"]["gangScheduling"] == "Enabled"
    for pod in pods(cluster, namespace, name):
        assert pod["spec"]["schedulingGroup"] == {"podGroupName": name}
    assert all("schedulingGroup" not in p["spec"] for p in pods(cluster, namespace, name, "store"))
    wait_for(
        lambda: any(
            c["type"] == "PodGroupInitiallyScheduled" and c["status"] == "True"
            for c in (pod_group(cluster, namespace, name) or {})
            .get("status", {})
            .get("conditions", [])
        ),
        60,
        "the scheduler records the gang placed",
    )

    # Above the minimum, one more pod joins a group already at its minimum.
    cluster.kubectl("scale", "-n", namespace, f"ej/{name}", "--replicas=3")
    wait_for(lambda: len(bound(cluster, namespace, name)) == 3, 60, "3 workers placed")

    # minCount follows minReplicas (the pods roll: minReplicas is in their template hash).
    patch_spec(cluster, namespace, name, minReplicas=3)
    wait_for(
        lambda: min_count(pod_group(cluster, namespace, name)) == 3, 60, "minCount raised to 3"
    )
    wait_for(lambda: len(bound(cluster, namespace, name)) == 3, 90, "3 workers placed again")

    # The group goes with the job (garbage collection; its protection finalizer
    # holds it until the pods are gone).
    uid = group["metadata"]["uid"]
    cluster.kubectl("delete", "ej", name, "-n", namespace, "--wait=false")
    wait_for(
        lambda: (pod_group(cluster, namespace, name) or {}).get("metadata", {}).get("uid") != uid,
        90,
        "the PodGroup deleted with the job",
    )


def test_a_gang_larger_than_a_creation_batch_is_created_and_placed_whole(
    cluster: Cluster, namespace: str, operator: Reconciler
) -> None:
    # Creation goes in batches of 16 until pods get nodes (pacing.py); a gang of 20
    # gets no node until all 20 exist, so its minimum is created at once.
    assert operator.settings.create_batch_initial < 20
    cluster.kwok_nodes(2, prefix="gang-kwok")
    name = "biggang"
    apply(cluster, namespace, kwok_job(name, minReplicas=20, maxReplicas=20))
    wait_for(lambda: len(bound(cluster, namespace, name)) == 20, 90, "20 workers placed")
    assert min_count(pod_group(cluster, namespace, name)) == 20
