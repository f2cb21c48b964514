"""The operator against the real control plane: pods, Services, scaling, failures, GC.

kopf runs in-process (``operator`` fixture); pods run on kwok's fake nodes
(no processes) or, where exit codes matter, as real processes on the
process node.
"""

from __future__ import annotations

import pytest
from kubernetes import client

from e2e.cluster import Cluster
from tests.integration.operator.conftest import run_operator
from tests.integration.operator.jobs import (
    apply,
    events,
    job_status,
    kwok_job,
    live_workers,
    pods,
    process_job,
    wait_job_phase,
)
from tests.support import wait_for
from torchflex_contract import env, labels
from torchflex_operator.runtime.reconcile import Reconciler

pytestmark = pytest.mark.cluster
W = labels.worker_pod_name


def test_create_scale_restart_replace_and_delete(
    cluster: Cluster, namespace: str, operator: Reconciler
) -> None:
    cluster.kwok_nodes(2, prefix="op-kwok")
    name = "life"
    apply(cluster, namespace, kwok_job(name, minReplicas=1, maxReplicas=4, replicas=2))
    wait_for(
        lambda: set(live_workers(cluster, namespace, name)) == {W(name, 0), W(name, 1)},
        60,
        "2 worker pods",
    )
    wait_for(lambda: pods(cluster, namespace, name, "store"), 30, "store pod")
    svcs = cluster.kubectl("get", "svc", "-n", namespace, "-o", "name").stdout.split()
    assert {f"service/{name}-workers", f"service/{name}-store"} <= set(svcs)
    pod = pods(cluster, namespace, name)[0]
    assert pod["spec"]["subdomain"] == f"{name}-workers"
    assert pod["metadata"]["ownerReferences"][0]["kind"] == labels.KIND
    assert pod["spec"]["containers"][0]["command"][:2] == ["env", "--"]
    wait_job_phase(cluster, namespace, name, "Running", 60)
    before = live_workers(cluster, namespace, name)

    # Scale up through the scale subresource.
    cluster.kubectl("scale", "-n", namespace, f"ej/{name}", "--replicas=3")
    wait_for(lambda: len(live_workers(cluster, namespace, name)) == 3, 60, "3 workers")
    assert job_status(cluster, namespace, name).get("desiredReplicas") == 3
    # Scale down removes the highest index.
    cluster.kubectl("scale", "-n", namespace, f"ej/{name}", "--replicas=2")
    wait_for(lambda: set(live_workers(cluster, namespace, name)) == set(before), 60, "back to 2")
    assert live_workers(cluster, namespace, name) == before
    reasons = events(cluster, namespace, name)
    assert "ScaledUp" in reasons and "ScaledDown" in reasons

    # A deleted pod is replaced at once: under its own name if the old pod is
    # already gone, else at a free index (a terminating pod keeps its index).
    victim = W(name, 0)
    cluster.kubectl("delete", "pod", "-n", namespace, victim, "--wait=false")

    def replaced() -> bool:
        now = live_workers(cluster, namespace, name)
        return len(now) == 2 and before[victim] not in now.values()

    wait_for(replaced, 60, "replacement of worker-0")
    assert job_status(cluster, namespace, name).get("failures") == 0

    # Deleting the job removes everything it owns (the real garbage collector).
    cluster.kubectl("delete", "ej", "-n", namespace, name, "--wait=false")
    wait_for(
        lambda: (
            not cluster.kubectl(
                "get",
                "pods,svc",
                "-n",
                namespace,
                "-l",
                f"{labels.Label.JOB_NAME}={name}",
                "-o",
                "name",
            ).stdout.strip()
        ),
        90,
        "owned pods and services gone",
    )


def test_operator_restart_creates_no_duplicates(
    cluster: Cluster, namespace: str, operator: Reconciler
) -> None:
    cluster.kwok_nodes(2, prefix="op-kwok")
    name = "restart"
    apply(cluster, namespace, kwok_job(name, minReplicas=1, maxReplicas=4, replicas=3))
    wait_for(lambda: len(live_workers(cluster, namespace, name)) == 3, 60, "3 workers")
    before = live_workers(cluster, namespace, name)
    # A second incarnation against the same state (the fixture's first is still
    # idle-watching; a real restart stops it first: both must be safe).
    with run_operator(cluster, namespace):
        cluster.kubectl("scale", "-n", namespace, f"ej/{name}", "--replicas=4")
        wait_for(lambda: len(live_workers(cluster, namespace, name)) == 4, 60, "4 workers")
    after = live_workers(cluster, namespace, name)
    assert {k: after[k] for k in before} == before
    all_pods = pods(cluster, namespace, name)
    indices = [p["metadata"]["labels"][labels.Label.REPLICA_INDEX] for p in all_pods]
    assert len(indices) == len(set(indices)) == 4
    assert len(pods(cluster, namespace, name, "store")) == 1


def test_eviction_and_node_loss_are_replaced_not_counted(
    cluster: Cluster, namespace: str, operator: Reconciler
) -> None:
    nodes = cluster.kwok_nodes(3, prefix="op-evict")
    cluster.kubectl("label", "node", "--overwrite", *nodes, "torchflex-test=evict")
    name = "evict"
    job = kwok_job(name, minReplicas=1, maxReplicas=2, backoffLimit=0)
    job["spec"]["template"]["spec"]["nodeSelector"] = {"torchflex-test": "evict"}
    apply(cluster, namespace, job)
    wait_for(lambda: len(live_workers(cluster, namespace, name)) == 2, 60, "2 workers")
    before = live_workers(cluster, namespace, name)

    def replaced(old_uid: str, not_on: str | None = None) -> bool:
        now = [
            p for p in pods(cluster, namespace, name) if not p["metadata"].get("deletionTimestamp")
        ]
        uids = {p["metadata"]["uid"] for p in now}
        on_node = any(p["spec"].get("nodeName") == not_on for p in now) if not_on else False
        return len(now) == 2 and old_uid not in uids and not on_node

    core = client.CoreV1Api(cluster.api_client())
    victim = W(name, 1)
    core.create_namespaced_pod_eviction(
        victim,
        namespace,
        client.V1Eviction(metadata=client.V1ObjectMeta(name=victim, namespace=namespace)),
    )
    wait_for(lambda: replaced(before[victim]), 60, "evicted pod replaced")
    # Lose the node under worker-0: its pod is removed and replaced elsewhere.
    pod0 = next(p for p in pods(cluster, namespace, name) if p["metadata"]["name"] == W(name, 0))
    node = pod0["spec"]["nodeName"]
    assert node in nodes
    cluster.delete_node(node)
    wait_for(lambda: replaced(before[W(name, 0)], node), 150, "worker-0 replaced elsewhere")
    st = job_status(cluster, namespace, name)
    assert st.get("failures") == 0
    assert st.get("phase") != "Failed"


def test_user_error_counts_until_backoff_limit(
    cluster: Cluster, namespace: str, operator: Reconciler
) -> None:
    name = "usererr"
    # Like the agent: a final AgentReport in the termination log, then exit 1.
    report = '{"state": "Failed", "message": "boom: bad hyperparameter"}'
    command = [
        "python",
        "-c",
        f"import sys; open('/dev/termination-log', 'w').write({report!r}); sys.exit(1)",
    ]
    apply(
        cluster,
        namespace,
        process_job(
            name, cluster.process_node, command, minReplicas=1, maxReplicas=1, backoffLimit=1
        ),
    )
    wait_job_phase(cluster, namespace, name, "Failed", 120)
    st = job_status(cluster, namespace, name)
    assert st["failures"] == 2
    conditions = {c["type"]: c for c in st["conditions"]}
    assert conditions["Failed"]["reason"] == "BackoffLimitExceeded"
    last = st["lastFailure"]
    assert last["reason"] == "UserError" and last["exitCode"] == 1
    assert "boom" in last["message"]
    assert "PodFailed" in events(cluster, namespace, name)
    # The last failed pod is kept for its logs (cleanPodPolicy Running).
    assert pods(cluster, namespace, name)[0]["status"]["phase"] == "Failed"


# Index 1 exits 0 at once; index 0 works on. No agent runs here, so there is no
# report of the final round: torchrun's rule applies (wait for every worker).
ONE_DONE_ONE_WORKING = [
    "python",
    "-c",
    f"import os, time; time.sleep(0 if os.environ[{env.REPLICA_INDEX!r}] == '1' else 300)",
]


def test_worker_success_completes_the_job_once_no_worker_runs(
    cluster: Cluster, namespace: str, operator: Reconciler
) -> None:
    name = "done"
    job = process_job(
        name, cluster.process_node, ONE_DONE_ONE_WORKING, minReplicas=1, maxReplicas=2
    )
    apply(cluster, namespace, job)
    wait_for(lambda: "Completing" in events(cluster, namespace, name), 60, "Completing")
    # worker-1 exited 0 but worker-0 still works: nothing stops it, no Succeeded yet.
    assert job_status(cluster, namespace, name).get("phase") == "Running"
    assert W(name, 0) in live_workers(cluster, namespace, name)
    # It ends (deleted here; a pod being deleted is no longer awaited): the job succeeds.
    cluster.kubectl("delete", "pod", "-n", namespace, W(name, 0), "--wait=false")
    wait_job_phase(cluster, namespace, name, "Succeeded", 120)
    assert "Succeeded" in events(cluster, namespace, name)


def test_restart_keeps_status_and_catches_up_on_missed_changes(
    cluster: Cluster, namespace: str, crd: None, kubeconfig_env: None
) -> None:
    cluster.kwok_nodes(2, prefix="op-kwok")
    name = "reborn"
    with run_operator(cluster, namespace):
        apply(cluster, namespace, kwok_job(name, minReplicas=1, maxReplicas=4, replicas=3))
        wait_for(
            lambda: job_status(cluster, namespace, name).get("readyReplicas") == 3, 60, "3 ready"
        )
        before = job_status(cluster, namespace, name)
    # Operator down: the job is scaled and a pod vanishes; nobody watches.
    cluster.kubectl("scale", "-n", namespace, f"ej/{name}", "--replicas=4")
    gone = live_workers(cluster, namespace, name)[W(name, 1)]
    cluster.kubectl("delete", "pod", "-n", namespace, W(name, 1), "--wait=true")
    with run_operator(cluster, namespace):

        def caught_up() -> bool:
            now = live_workers(cluster, namespace, name)
            st = job_status(cluster, namespace, name)
            return len(now) == 4 and gone not in now.values() and st.get("readyReplicas") == 4

        wait_for(caught_up, 60, "4 workers, the lost one replaced")
        after = job_status(cluster, namespace, name)
    indices = [
        p["metadata"]["labels"][labels.Label.REPLICA_INDEX] for p in pods(cluster, namespace, name)
    ]
    assert sorted(indices) == ["0", "1", "2", "3"]
    assert len(pods(cluster, namespace, name, "store")) == 1
    # Nothing the first incarnation recorded was lost or reset by the second.
    for key in ("startTime", "rendezvousHost", "failures", "replacements", "phase"):
        assert after[key] == before[key], key
    cond = {c["type"]: c for c in after["conditions"]}
    old = {c["type"]: c for c in before["conditions"]}
    # Never dipped below minReplicas in between (the transition time would move).
    assert cond["MinAvailable"]["lastTransitionTime"] == old["MinAvailable"]["lastTransitionTime"]
    assert after["desiredReplicas"] == 4
