"""Job-level rules on the real control plane: suspend/resume, TTL, deadline,
minimum availability, rolling a changed spec, and an idle operator's cost.

kopf runs in-process (``operator`` fixture or ``run_operator``); pods run on
kwok's fake nodes, or as real processes where the pod must exit.
"""

from __future__ import annotations

import dataclasses
import time

import pytest

from e2e.cluster import Cluster
from tests.integration.operator.conftest import TEST_SETTINGS, run_operator
from tests.integration.operator.jobs import (
    apply,
    condition,
    event_messages,
    events,
    get_job,
    job_status,
    kwok_job,
    live_workers,
    patch_spec,
    pods,
    process_job,
    wait_job_phase,
)
from tests.support import wait_for
from torchflex_contract import labels
from torchflex_operator.runtime.metrics import Metrics
from torchflex_operator.runtime.reconcile import Reconciler

pytestmark = pytest.mark.cluster


def job_exists(cluster: Cluster, ns: str, name: str) -> bool:
    return cluster.kubectl("get", "ej", name, "-n", ns, check=False).returncode == 0


def all_pods(cluster: Cluster, ns: str, name: str) -> list[str]:
    out = cluster.kubectl(
        "get", "pods", "-n", ns, "-o", "name", "-l", f"{labels.Label.JOB_NAME}={name}"
    )
    return out.stdout.split()


def test_suspend_deletes_pods_keeps_job_and_resume_recreates(
    cluster: Cluster, namespace: str, operator: Reconciler
) -> None:
    cluster.kwok_nodes(2, prefix="op-kwok")
    name = "susp"
    apply(cluster, namespace, kwok_job(name, minReplicas=1, maxReplicas=2))
    wait_job_phase(cluster, namespace, name, "Running", 60)
    before = live_workers(cluster, namespace, name)
    assert len(before) == 2

    patch_spec(cluster, namespace, name, suspend=True)
    wait_for(lambda: not all_pods(cluster, namespace, name), 60, "every pod deleted")
    st = job_status(cluster, namespace, name)
    assert st["phase"] == "Suspended" and "startTime" not in st
    cond = condition(get_job(cluster, namespace, name), "Suspended")
    assert cond is not None and (cond["status"], cond["reason"]) == ("True", "SuspendedByUser")
    svcs = cluster.kubectl("get", "svc", "-n", namespace, "-o", "name").stdout.split()
    assert f"service/{name}-workers" in svcs  # Services and the job stay

    patch_spec(cluster, namespace, name, suspend=False)
    wait_for(lambda: len(live_workers(cluster, namespace, name)) == 2, 60, "2 workers again")
    wait_job_phase(cluster, namespace, name, "Running", 60)
    assert not set(live_workers(cluster, namespace, name).values()) & set(before.values())
    cond = condition(get_job(cluster, namespace, name), "Suspended")
    assert cond is not None and (cond["status"], cond["reason"]) == ("False", "Resumed")
    reasons = events(cluster, namespace, name)
    assert "Suspended" in reasons and "Resumed" in reasons


def test_ttl_after_finished_deletes_the_job(
    cluster: Cluster, namespace: str, operator: Reconciler
) -> None:
    name = "ttl"
    command = ["python", "-c", "pass"]
    job = process_job(
        name, cluster.process_node, command, minReplicas=1, maxReplicas=1, ttlSecondsAfterFinished=2
    )
    apply(cluster, namespace, job)
    wait_for(lambda: not job_exists(cluster, namespace, name), 120, "job deleted by its TTL")
    reasons = events(cluster, namespace, name)  # Events outlive the job
    assert "Succeeded" in reasons and "TTLExpired" in reasons
    wait_for(lambda: not all_pods(cluster, namespace, name), 60, "its pods collected")


def test_active_deadline_fails_the_job_with_condition_and_event(
    cluster: Cluster, namespace: str, operator: Reconciler
) -> None:
    cluster.kwok_nodes(2, prefix="op-kwok")
    name = "deadline"
    apply(cluster, namespace, kwok_job(name, minReplicas=1, maxReplicas=2, activeDeadlineSeconds=3))
    wait_job_phase(cluster, namespace, name, "Failed", 60)
    cond = condition(get_job(cluster, namespace, name), "Failed")
    assert cond is not None and (cond["status"], cond["reason"]) == ("True", "DeadlineExceeded")
    failed = [m for r, m in event_messages(cluster, namespace, name) if r == "Failed"]
    assert failed and "activeDeadlineSeconds=3" in failed[0]
    wait_for(lambda: not live_workers(cluster, namespace, name), 60, "running pods stopped")


def test_below_min_replicas_too_long_fails_with_reason(
    cluster: Cluster, namespace: str, operator: Reconciler
) -> None:
    name = "starved"
    job = kwok_job(name, minReplicas=2, maxReplicas=2, minAvailableTimeoutSeconds=3)
    job["spec"]["template"]["spec"]["nodeSelector"] = {"torchflex-test": "no-such-node"}
    apply(cluster, namespace, job)
    wait_job_phase(cluster, namespace, name, "Failed", 60)
    obj = get_job(cluster, namespace, name)
    cond = condition(obj, "Failed")
    assert cond is not None and cond["reason"] == "MinAvailableTimeout"
    avail = condition(obj, "MinAvailable")
    assert avail is not None and (avail["status"], avail["reason"]) == ("False", "BelowMinReplicas")
    failed = [m for r, m in event_messages(cluster, namespace, name) if r == "Failed"]
    assert failed and "0 of minimum 2 workers running" in failed[0]
    assert "minAvailableTimeoutSeconds=3" in failed[0]


def test_changed_spec_rolls_pods_one_at_a_time(
    cluster: Cluster, namespace: str, operator: Reconciler
) -> None:
    cluster.kwok_nodes(2, prefix="op-kwok")
    name = "roll"
    job = kwok_job(name, minReplicas=1, maxReplicas=3)
    apply(cluster, namespace, job)
    wait_for(lambda: job_status(cluster, namespace, name).get("readyReplicas") == 3, 60, "3 ready")
    before = live_workers(cluster, namespace, name)
    old_hash = pods(cluster, namespace, name)[0]["metadata"]["annotations"][
        labels.Annotation.SPEC_HASH
    ]

    job["spec"]["template"]["metadata"] = {"labels": {"revision": "2"}}
    apply(cluster, namespace, job)

    def rolled() -> bool:
        live = [
            p for p in pods(cluster, namespace, name) if not p["metadata"].get("deletionTimestamp")
        ]
        hashes = {p["metadata"]["annotations"][labels.Annotation.SPEC_HASH] for p in live}
        st = job_status(cluster, namespace, name)
        return len(live) == 3 and old_hash not in hashes and st.get("updatedReplicas") == 3

    wait_for(rolled, 120, "every worker on the new spec")
    after = live_workers(cluster, namespace, name)
    assert not set(after.values()) & set(before.values())
    assert all(
        p["metadata"]["labels"].get("revision") == "2" for p in pods(cluster, namespace, name)
    )
    rolling = [m for r, m in event_messages(cluster, namespace, name) if r == "RollingUpdate"]
    # One running worker per step: three steps, each naming exactly one pod.
    assert len(rolling) == 3, rolling
    assert all(m.count(f"{name}-worker-") == 1 for m in rolling), rolling
    st = job_status(cluster, namespace, name)
    assert st["failures"] == 0 and st["replacements"] == 0 and st["phase"] == "Running"


def counter(metrics: Metrics, name: str) -> float:
    return sum(
        s.value for family in metrics.registry.collect() for s in family.samples if s.name == name
    )


def test_idle_operator_resyncs_from_cache_without_api_requests(
    cluster: Cluster, namespace: str, crd: None, kubeconfig_env: None
) -> None:
    cluster.kwok_nodes(2, prefix="op-kwok")
    name = "idle"
    fast_resync = dataclasses.replace(TEST_SETTINGS, resync_s=0.5)
    with run_operator(cluster, namespace, settings=fast_resync) as reconciler:
        apply(cluster, namespace, kwok_job(name, minReplicas=1, maxReplicas=2))
        wait_for(
            lambda: job_status(cluster, namespace, name).get("readyReplicas") == 2, 60, "ready"
        )
        m = reconciler.metrics

        def settled() -> bool:
            first = counter(m, "torchflex_api_requests_total")
            time.sleep(2)
            return counter(m, "torchflex_api_requests_total") == first

        wait_for(settled, 60, "no more API requests once steady")
        requests = counter(m, "torchflex_api_requests_total")
        passes = counter(m, "torchflex_reconcile_total")
        time.sleep(5)  # ~10 slow-resync passes at 0.5 s
        assert counter(m, "torchflex_reconcile_total") >= passes + 5
        assert counter(m, "torchflex_api_requests_total") == requests
