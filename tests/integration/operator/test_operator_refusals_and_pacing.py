"""Names, refusals, pacing, pending Events, fencing, completion on the real control plane.

* The CRD refuses a job name too long for the pod names derived from it, and
  the longest accepted name really yields valid pods and Services.
* Pod Security admission (a namespace labelled ``enforce=restricted``)
  refusing the worker pods becomes a condition and a Warning Event with the
  server's message; relabelling the namespace lets the job start.
* ``maxReplicas: 200`` on one kwok node (110 pods fit): creation goes in
  growing batches and never more than the cap sit unscheduled.
* Events a dead operator left in ``status.pendingEvents`` are posted by the next.
* A pod the group declared lost, whose agent does not answer, is fenced and
  replaced, not counted against ``backoffLimit``.
* Agents reporting that they cannot reach their store turn the job's
  ``RendezvousStoreReachable`` condition False, with one Warning Event.
* A command that cannot start (exit 127) fails the job at once.
* A job succeeds only once every member of its final round exited 0: rank 0
  saving after the others exited is neither stopped nor cut short.

The agents here are small HTTP servers in real pods on the harness bridge
serving fixed reports: the operator's side of the contract, not the agent's.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import Cluster
from tests.integration.operator.conftest import TEST_SETTINGS, run_operator
from tests.integration.operator.jobs import (
    apply,
    condition,
    event_messages,
    fake_agent,
    get_job,
    kwok_job,
    pods,
    process_job,
    wait_job_phase,
)
from tests.support import wait_for
from torchflex_contract import env, labels
from torchflex_contract.exit_codes import ExitCode
from torchflex_operator.runtime.agent_status import StatusPoller

pytestmark = pytest.mark.cluster
W = labels.worker_pod_name


@pytest.fixture()
def kwok_node(cluster: Cluster, namespace: str) -> Iterator[str]:
    """One fresh kwok node (110 pods fit), deleted afterwards."""
    (node,) = cluster.kwok_nodes(1, prefix=f"op-{namespace}")
    try:
        yield node
    finally:
        cluster.delete_node(node)


def create(cluster: Cluster, namespace: str, job: dict[str, Any]) -> Any:
    return cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(job), check=False)


def test_name_limit_follows_max_replicas_and_the_longest_name_works(
    cluster: Cluster, namespace: str, crd: None, kubeconfig_env: None, kwok_node: str
) -> None:
    name = "n" * 54  # the limit with maxReplicas <= 10: <name>-worker-9 is 63 characters
    refused = create(cluster, namespace, kwok_job(name, minReplicas=1, maxReplicas=11))
    assert refused.returncode != 0
    assert "at most 53 characters when spec.maxReplicas <= 100" in refused.stderr
    assert create(cluster, namespace, kwok_job(name, minReplicas=1, maxReplicas=10)).returncode == 0
    # Raising maxReplicas past what the name allows is refused too.
    patch = json.dumps({"spec": {"maxReplicas": 11}})
    out = cluster.kubectl(
        "patch", "ej", name, "-n", namespace, "--type=merge", "-p", patch, check=False
    )
    assert out.returncode != 0 and "metadata.name is too long" in out.stderr
    with run_operator(cluster, namespace):
        wait_for(
            lambda: (
                sum(p["status"].get("phase") == "Running" for p in pods(cluster, namespace, name))
                == 10
            ),
            120,
            "10 workers running under the longest allowed name",
        )
        services = cluster.kubectl("get", "svc", "-n", namespace, "-o", "name").stdout.split()
        assert f"service/{labels.workers_service_name(name)}" in services
        job = get_job(cluster, namespace, name)
        accepted = condition(job, "ChildrenAccepted")
        assert accepted is None or accepted["status"] == "True"


def test_pod_security_refusal_is_a_condition_and_an_event(
    cluster: Cluster, namespace: str, crd: None, kubeconfig_env: None, kwok_node: str
) -> None:
    name = "psa"
    cluster.kubectl(
        "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted"
    )
    with run_operator(cluster, namespace):
        apply(cluster, namespace, kwok_job(name, minReplicas=1, maxReplicas=2))

        def refused() -> dict[str, Any] | None:
            cond = condition(get_job(cluster, namespace, name), "ChildrenAccepted")
            return cond if cond and cond["status"] == "False" else None

        wait_for(refused, 60, "ChildrenAccepted=False on the job")
        cond = refused()
        assert cond is not None and "PodSecurity" in cond["message"]
        assert "HTTP 403" in cond["message"]
        warned = [m for r, m in event_messages(cluster, namespace, name) if r == "CreateRefused"]
        assert warned and "PodSecurity" in warned[0]
        job = get_job(cluster, namespace, name)
        assert job["status"]["phase"] != "Failed"  # a 403 from admission can go away
        size = condition(job, "AtDesiredSize")
        assert size is not None and size["reason"] == "CreateRefused"
        # It does go away: the namespace is relabelled and the job starts.
        cluster.kubectl(
            "label",
            "namespace",
            namespace,
            "pod-security.kubernetes.io/enforce=privileged",
            "--overwrite",
        )

        def accepted() -> bool:
            job = get_job(cluster, namespace, name)
            cond = condition(job, "ChildrenAccepted")
            return bool(cond and cond["status"] == "True" and job["status"]["phase"] == "Running")

        wait_for(accepted, 60, "the job running once the namespace admits its pods")


def test_large_job_is_created_in_batches_with_a_cap_on_pending(
    cluster: Cluster, namespace: str, crd: None, kubeconfig_env: None, kwok_node: str
) -> None:
    name = "wide"
    node = kwok_node  # 110 pods fit
    cap = 20
    settings = dataclasses.replace(TEST_SETTINGS, max_unscheduled=cap, create_batch_initial=8)
    # An external rendezvous endpoint: no store pod takes one of the node's 110 places.
    rdzv = {"backend": "etcd", "endpoint": "http://127.0.0.1:2379"}
    job = kwok_job(name, minReplicas=1, maxReplicas=200, rendezvous=rdzv)
    job["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    worst = {"unscheduled": 0, "total": 0}
    stop = threading.Event()

    def watch_counts() -> None:
        # Bounded: stops with the test, at most one listing per 0.2 s.
        for _ in range(3000):
            if stop.wait(0.2):
                return
            items = pods(cluster, namespace, name)
            live = [p for p in items if not p["metadata"].get("deletionTimestamp")]
            unscheduled = sum(1 for p in live if not p["spec"].get("nodeName"))
            worst["unscheduled"] = max(worst["unscheduled"], unscheduled)
            worst["total"] = max(worst["total"], len(live))

    watcher = threading.Thread(target=watch_counts, daemon=True)
    with run_operator(cluster, namespace, settings=settings):
        watcher.start()
        try:
            apply(cluster, namespace, job)

            def capped() -> dict[str, Any] | None:
                cond = condition(get_job(cluster, namespace, name), "AtDesiredSize")
                return cond if cond and cond["reason"] == "PendingCapReached" else None

            wait_for(capped, 180, "AtDesiredSize=False, PendingCapReached")
            wait_for(
                lambda: len(pods(cluster, namespace, name)) == 110 + cap,
                60,
                "110 scheduled workers and the cap of unscheduled ones",
            )
        finally:
            stop.set()
            watcher.join(timeout=30)
        cond = capped()
        assert cond is not None and f"{cap} pod(s) wait for a node" in cond["message"]
    assert worst["unscheduled"] <= cap, worst
    assert worst["total"] <= 110 + cap, worst
    created = [m for r, m in event_messages(cluster, namespace, name) if r == "CreatedPod"]
    batches = [m.count(f"{name}-worker-") for m in created]
    first = [m for m in created if f" {name}-worker-0," in m]  # Events share timestamps
    assert len(first) == 1 and first[0].count(f"{name}-worker-") == 8, first
    assert max(batches) <= cap, batches
    assert "PendingCapReached" in [r for r, _ in event_messages(cluster, namespace, name)]


def test_events_left_pending_by_a_dead_operator_are_posted(
    cluster: Cluster, namespace: str, crd: None, kubeconfig_env: None
) -> None:
    name = "pending-events"
    create(cluster, namespace, kwok_job(name, minReplicas=1, maxReplicas=1, suspend=True))
    # What an operator that died between its status write and its posts leaves behind.
    left = {
        "phase": "Suspended",
        "eventSeq": 7,
        "pendingEvents": [
            {"id": 7, "type": "Warning", "reason": "PodFailed", "message": "left by the dead one"}
        ],
    }
    cluster.kubectl(
        "patch",
        "ej",
        name,
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": left}),
    )
    with run_operator(cluster, namespace):
        wait_for(
            lambda: (
                ("PodFailed", "left by the dead one") in event_messages(cluster, namespace, name)
            ),
            60,
            "the pending Event posted by the new operator",
        )
        wait_for(
            lambda: "pendingEvents" not in get_job(cluster, namespace, name)["status"],
            60,
            "pendingEvents cleared once posted",
        )
    posted = [m for r, m in event_messages(cluster, namespace, name) if r == "PodFailed"]
    assert posted == ["left by the dead one"]  # once, not once per pass


SILENT_OR_REPORTING = fake_agent(
    before=f"""index = int(os.environ[{env.REPLICA_INDEX!r}])
marker = os.path.join(sys.argv[1], "worker-1-was-silent")
job = os.environ[{env.JOB_NAME!r}]
if index == 1 and not os.path.exists(marker):
    open(marker, "w").close()
    time.sleep(600)  # a member gone silent: it never answers /status
lost = [job + "-worker-1"] if index == 0 else []""",
    report="""dict(state="Running", round=4, world_size=2, node_rank=index, nodes=2,
                         lost_pods=lost, lost_round=3)""",
)


def test_member_declared_lost_and_silent_is_fenced_and_replaced(
    cluster: Cluster, namespace: str, crd: None, kubeconfig_env: None, tmp_path: Path
) -> None:
    name = "fence"
    tmp_path.chmod(0o777)
    poller = StatusPoller(enabled=True, timeout=1.0, interval=1.0)
    with run_operator(cluster, namespace, poller=poller):
        command = ["python", "-c", SILENT_OR_REPORTING, str(tmp_path)]
        job = process_job(
            name, cluster.process_node, command, minReplicas=2, maxReplicas=2, backoffLimit=0
        )
        apply(cluster, namespace, job)

        def fenced() -> list[str]:
            return [m for r, m in event_messages(cluster, namespace, name) if r == "FencedPod"]

        wait_for(fenced, 90, "the silent worker-1 fenced")
        assert W(name, 1) in fenced()[0] and "does not answer" in fenced()[0]

        def replaced() -> bool:
            live = [
                p
                for p in pods(cluster, namespace, name)
                if not p["metadata"].get("deletionTimestamp")
                and p["status"].get("phase") == "Running"
            ]
            return len(live) == 2

        wait_for(replaced, 90, "worker-1 replaced and running again")
        st = get_job(cluster, namespace, name)["status"]
        assert st["failures"] == 0 and st["phase"] == "Running"
        assert st["lastFailure"]["reason"] == "MemberLost"
        assert st["lastFailure"]["counted"] is False
    assert len(fenced()) == 1


BLIND_TO_STORE = fake_agent(
    report="""dict(state="Rendezvous", round=2, world_size=2, node_rank=0, nodes=2,
                         store_error="store 10.0.0.9:29400: no reply within 2.0s")""",
)


def test_agents_blind_to_their_store_show_in_status_and_an_event(
    cluster: Cluster, namespace: str, crd: None, kubeconfig_env: None
) -> None:
    name = "blind"
    poller = StatusPoller(enabled=True, timeout=1.0, interval=1.0)
    with run_operator(cluster, namespace, poller=poller):
        command = ["python", "-c", BLIND_TO_STORE]
        job = process_job(name, cluster.process_node, command, minReplicas=1, maxReplicas=1)
        apply(cluster, namespace, job)

        def unreachable() -> dict[str, Any] | None:
            cond = condition(get_job(cluster, namespace, name), "RendezvousStoreReachable")
            return cond if cond and cond["status"] == "False" else None

        wait_for(unreachable, 90, "RendezvousStoreReachable=False on the job")
        cond = unreachable()
        assert cond is not None and "no reply within 2.0s" in cond["message"]
        st = get_job(cluster, namespace, name)["status"]
        assert st["storeUnreachableSince"] in cond["message"]
        warned = [m for r, m in event_messages(cluster, namespace, name) if r == "StoreUnreachable"]
        assert len(warned) == 1 and "1 of 1 reporting agent(s)" in warned[0]


BAD_COMMAND_AGENT = f"""
import json, sys
report = dict(state="Failed", message="cannot run /nonexistent/train.py: no such file")
with open("/dev/termination-log", "w") as f:
    f.write(json.dumps(report))
sys.exit({int(ExitCode.BAD_COMMAND)})
"""


def test_command_that_cannot_start_fails_the_job_at_once(
    cluster: Cluster, namespace: str, crd: None, kubeconfig_env: None
) -> None:
    name = "badcmd"
    with run_operator(cluster, namespace):
        # What the agent does when the training command cannot be started.
        command = ["python", "-c", BAD_COMMAND_AGENT]
        job = process_job(
            name, cluster.process_node, command, minReplicas=1, maxReplicas=2, backoffLimit=6
        )
        apply(cluster, namespace, job)
        wait_job_phase(cluster, namespace, name, "Failed", 90)
        st = get_job(cluster, namespace, name)["status"]
        failed = condition(get_job(cluster, namespace, name), "Failed")
        assert failed is not None and failed["reason"] == "BadCommand"
        assert "cannot run /nonexistent/train.py" in failed["message"]
        assert st["failures"] <= 2  # failed at once, not retried up to backoffLimit (6)


RANK0_SAVES_LAST = f"""
import json, os, time
index = int(os.environ[{env.REPLICA_INDEX!r}])
# Index 1 holds rank 0 and saves the final model for a while; index 0 (rank 1) is done.
time.sleep(6 if index == 1 else 1)
report = dict(state="Succeeded", round=2, world_size=2, nodes=2, node_rank=1 - index)
with open("/dev/termination-log", "w") as f:
    f.write(json.dumps(report))
"""


def test_job_succeeds_only_when_every_member_of_the_final_round_exited_0(
    cluster: Cluster, namespace: str, crd: None, kubeconfig_env: None
) -> None:
    name = "finish"
    with run_operator(cluster, namespace):
        command = ["python", "-c", RANK0_SAVES_LAST]
        job = process_job(name, cluster.process_node, command, minReplicas=2, maxReplicas=2)
        apply(cluster, namespace, job)

        def phase_of(index: int) -> str:
            found = [
                p for p in pods(cluster, namespace, name) if p["metadata"]["name"] == W(name, index)
            ]
            return str(found[0]["status"].get("phase")) if found else ""

        wait_for(lambda: phase_of(0) == "Succeeded", 90, "rank 1 (index 0) exited 0")
        # Rank 0 still saves: the job waits, and nothing stops its pod.
        job_now = get_job(cluster, namespace, name)
        assert job_now["status"]["phase"] == "Running", job_now["status"]
        rank0 = [p for p in pods(cluster, namespace, name) if p["metadata"]["name"] == W(name, 1)]
        assert rank0 and not rank0[0]["metadata"].get("deletionTimestamp")
        wait_for(
            lambda: get_job(cluster, namespace, name)["status"].get("phase") == "Succeeded",
            90,
            "the job Succeeded once rank 0 exited 0",
        )
        assert phase_of(1) == "Succeeded"  # it ended by itself, never deleted first
        done = condition(get_job(cluster, namespace, name), "Succeeded")
        assert done is not None and "all 2 member(s) of rendezvous round 2" in done["message"]
        assert "Completing" in [r for r, _ in event_messages(cluster, namespace, name)]
