"""A pod stuck terminating on a lost node, and agents' live progress reports,
on the real control plane.

Node loss is made the way it happens: a Node that no kubelet serves (a
machine about to die) gets a worker, then reports NotReady; the real node
lifecycle and taint-eviction controllers delete its pod, which nothing on the
dead machine ever confirms, so it stays terminating until the operator
force-deletes it. Progress reports are served by real processes in their
pods' network namespaces on the harness bridge; the operator polls them.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

import pytest

from e2e.cluster import Cluster
from tests.integration.operator.conftest import run_operator
from tests.integration.operator.jobs import (
    apply,
    event_messages,
    fake_agent,
    get_job,
    kwok_job,
    pods,
    process_job,
)
from tests.support import wait_for
from torchflex_contract import env, labels
from torchflex_operator.runtime.agent_status import StatusPoller
from torchflex_operator.runtime.reconcile import Reconciler

pytestmark = pytest.mark.cluster
W = labels.worker_pod_name


def node_status(ready: bool) -> str:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    resources = {"cpu": "8", "memory": "32Gi", "pods": "110"}
    condition = {
        "type": "Ready",
        "status": "True" if ready else "False",
        "reason": "KubeletReady" if ready else "KubeletNotReady",
        "message": "test machine" if ready else "test: the machine is gone",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    status = {"conditions": [condition], "allocatable": resources, "capacity": resources}
    return json.dumps({"status": status})


def taints(cluster: Cluster, node: str) -> list[str]:
    spec = cluster.get_json("node", node).get("spec") or {}
    return [t["key"] for t in spec.get("taints") or []]


@pytest.fixture()
def doomed_node(cluster: Cluster) -> Iterator[str]:
    """A Node no kubelet serves (like a machine about to die), Ready for now."""
    name = "op-doomed-0"
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"torchflex-test": "lost"}},
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(node))
    cluster.kubectl("patch", "node", name, "--subresource=status", "-p", node_status(True))
    # Admission marks a new node not-ready; the node lifecycle controller lifts it.
    wait_for(lambda: not taints(cluster, name), 30, "the new node schedulable")
    try:
        yield name
    finally:
        cluster.kubectl("delete", "node", name, "--wait=false", check=False)


def test_pod_stuck_terminating_on_lost_node_is_force_deleted_and_replaced(
    cluster: Cluster, namespace: str, operator: Reconciler, doomed_node: str
) -> None:
    name = "lost"
    job = kwok_job(name, minReplicas=1, maxReplicas=1, backoffLimit=0)
    spec = job["spec"]["template"]["spec"]
    spec["nodeSelector"] = {"torchflex-test": "lost"}
    # Evicted 1 s after the node goes NotReady (the operator's default is 30 s).
    spec["tolerations"] += [
        {"key": k, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 1}
        for k in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
    ]
    apply(cluster, namespace, job)

    def worker() -> dict[str, Any] | None:
        found = [p for p in pods(cluster, namespace, name) if p["metadata"]["name"] == W(name, 0)]
        return found[0] if found else None

    wait_for(
        lambda: (w := worker()) is not None and w["spec"].get("nodeName") == doomed_node,
        60,
        "worker-0 bound to the doomed node",
    )
    first = worker()
    assert first is not None
    old_uid = first["metadata"]["uid"]
    # A healthy (kwok) node appears for the replacement; then the machine dies.
    (healthy,) = cluster.kwok_nodes(1, prefix="op-lost")
    cluster.kubectl("label", "node", "--overwrite", healthy, "torchflex-test=lost")
    cluster.kubectl("patch", "node", doomed_node, "--subresource=status", "-p", node_status(False))

    # The taint-eviction controller deletes the pod; nothing on the dead node confirms it.
    wait_for(
        lambda: (w := worker()) is not None and bool(w["metadata"].get("deletionTimestamp")),
        60,
        "the pod evicted from the lost node and stuck terminating",
    )

    def replaced() -> bool:
        w = worker()
        return (
            w is not None
            and w["metadata"]["uid"] != old_uid
            and not w["metadata"].get("deletionTimestamp")
            and w["spec"].get("nodeName") == healthy
        )

    wait_for(replaced, 90, "worker-0 force-deleted and replaced on the healthy node")
    forced = [m for r, m in event_messages(cluster, namespace, name) if r == "ForceDeletedPod"]
    assert forced and doomed_node in forced[0]
    st = get_job(cluster, namespace, name)["status"]
    assert st["failures"] == 0 and st["phase"] != "Failed"  # backoffLimit 0 and still alive


HTTP_SERVER = fake_agent(
    before=f"index = int(os.environ[{env.REPLICA_INDEX!r}])",
    report="""dict(state="Running", round=5 + index, world_size=2 + index,
                         node_rank=index, nodes=2, restarts=index + 1)""",
)


def test_agent_progress_reports_reach_job_status(
    cluster: Cluster, namespace: str, crd: None, kubeconfig_env: None
) -> None:
    name = "progress"
    poller = StatusPoller(enabled=True, timeout=1.0, interval=1.0)
    with run_operator(cluster, namespace, poller=poller):
        command = ["python", "-c", HTTP_SERVER]
        job = process_job(name, cluster.process_node, command, minReplicas=1, maxReplicas=2)
        apply(cluster, namespace, job)

        def reported() -> dict[str, object] | None:
            st = get_job(cluster, namespace, name).get("status") or {}
            return st if st.get("rendezvousRound") == 6 else None

        wait_for(reported, 90, "the agents' round in the job status")
        st = get_job(cluster, namespace, name)["status"]
        # The latest round wins; its world size; the most restarts any agent reported.
        assert (st["rendezvousRound"], st["worldSize"], st["restarts"]) == (6, 3, 2)
        ips = {p["status"].get("podIP") for p in pods(cluster, namespace, name)}
        assert all(ip and not ip.startswith("127.") for ip in ips)  # polled on the bridge
