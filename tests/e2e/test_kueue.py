"""Kueue admission: partial admission, preemption by a higher priority, and the way back.

Real Kueue (``e2e/cluster/kueue.py``: built from ``sigs.k8s.io/kueue``, run by
PID with ElasticJob as an external framework), the real operator process, real
agents and torch workers. A ClusterQueue holds cpu quota for 3 worker pods.
The low-priority job asks for 2..4 workers: Kueue admits it partially, at 3,
and it trains at world size 3. A second job of a higher WorkloadPriorityClass
needs 2: Kueue preempts the first, whose pods stop gracefully (SIGTERM, the
checkpoint stays) before its quota is given back; the second trains and ends,
its quota comes free, the first is admitted again and resumes from its
checkpoint to the end. A multi-role job (a fixed trainer role, an elastic reader
role) asks one pod set per role: Kueue admits the trainer whole and the readers
partially, and each role runs at its own admitted count.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster import Cluster, kueue
from e2e.trainlog import LogFollower
from e2e.workload import (
    TrainingJob,
    apply,
    get_job,
    job_events,
    role_entry,
    roles_manifest,
    worker_pods,
)
from tests.e2e.checks import checkpoint_step, wait_phase
from tests.support import wait_for

pytestmark = pytest.mark.timeout(600)
QUEUE = "team-a"
HIGH = "tf-e2e-high"
POD_CPU_M = 100
QUOTA_PODS = 3
# The low job's steps (0.1 s each): it is preempted a few seconds after its first checkpoint.
STEPS = 250


@pytest.fixture()
def queues(cluster: Cluster, namespace: str) -> Iterator[str]:
    """Kueue running, and the objects a platform team applies (docs/operations.md, Kueue)."""
    kueue.start(cluster.layout, cluster.bin_dir)
    cq = f"tf-{namespace}"
    docs: list[dict[str, Any]] = [
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
         "metadata": {"name": "default-flavor"}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
         "metadata": {"name": HIGH}, "value": 1000},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
         "metadata": {"name": cq},
         "spec": {
             "namespaceSelector": {
                 "matchLabels": {"kubernetes.io/metadata.name": namespace}},
             "preemption": {"withinClusterQueue": "LowerPriority"},
             "resourceGroups": [{
                 "coveredResources": ["cpu"],
                 "flavors": [{"name": "default-flavor", "resources": [
                     {"name": "cpu", "nominalQuota": f"{QUOTA_PODS * POD_CPU_M}m"}]}],
             }],
         }},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
         "metadata": {"name": QUEUE, "namespace": namespace},
         "spec": {"clusterQueue": cq}},
    ]  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    try:
        yield cq
    finally:
        # While Kueue still runs: the jobs go (their Workloads with them), then the
        # ClusterQueue, whose finalizer Kueue removes once nothing is admitted in it.
        for kind, name, ns in (
            ("elasticjobs", "--all", ["-n", namespace]),
            ("clusterqueue", cq, []),
        ):
            cluster.kubectl(
                "delete", kind, name, *ns, "--wait=true", "--timeout=60s", check=False, timeout=90
            )
        kueue.stop(cluster.layout)  # the other scenarios never meet it (its CRDs stay)


def _queued(job: TrainingJob, priority: str | None = None) -> dict[str, Any]:
    manifest = job.manifest()
    labels = {"kueue.x-k8s.io/queue-name": QUEUE}
    if priority is not None:
        labels["kueue.x-k8s.io/priority-class"] = priority
    manifest["metadata"]["labels"] = labels
    (trainer,) = manifest["spec"]["template"]["spec"]["containers"]
    trainer["resources"] = {"requests": {"cpu": f"{POD_CPU_M}m"}}
    return manifest


def _workload(cluster: Cluster, ns: str, job: str) -> dict[str, Any] | None:
    out = cluster.kubectl(
        "get", "workloads.kueue.x-k8s.io", f"elasticjob-{job}", "-n", ns, "-o", "json",
        check=False,
    )  # fmt: skip
    return json.loads(out.stdout) if out.returncode == 0 else None


def _condition(obj: dict[str, Any] | None, ctype: str) -> dict[str, Any]:
    conds = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == ctype), {})


def _admitted_count(cluster: Cluster, ns: str, job: str) -> int | None:
    wl = _workload(cluster, ns, job)
    if _condition(wl, "Admitted").get("status") != "True":
        return None
    (assignment,) = wl["status"]["admission"]["podSetAssignments"]  # type: ignore[index]
    return int(assignment["count"])


def _stopped_on_sigterm(cluster: Cluster, ns: str, job: str) -> bool:
    """A worker of the job printed the example's SIGTERM line (it saves, then exits)."""
    logs = cluster.layout.pods.glob(f"{ns}_{job}-worker-*/trainer.log")
    return any("on SIGTERM" in log.read_text(errors="replace") for log in logs)


def _worlds(follower: LogFollower, job: str) -> list[int]:
    return [ln.world for ln in follower.lines("step") if ln.pod.startswith(f"{job}-")]


# Kueue and its CRDs first: the operator then watches Workloads from its start.
@pytest.mark.usefixtures("queues", "operator_proc")
def test_partial_admission_preemption_and_readmission(
    cluster: Cluster, namespace: str, follower: LogFollower, ckpt_dir: Path
) -> None:
    low = TrainingJob("kq-low", ckpt_dir / "low", min_replicas=2, max_replicas=4, steps=STEPS)
    apply(cluster, namespace, _queued(low))

    # Quota for 3 of its 4 workers: admitted at 3, between min 2 and max 4.
    wait_for(lambda: _admitted_count(cluster, namespace, "kq-low") == 3, 120, "low admitted at 3")
    wait_for(lambda: 3 in _worlds(follower, "kq-low"), 240, "low training at world size 3")
    # Never above the admitted 3 (a first round may form at the minimum, 2, and grow).
    assert set(_worlds(follower, "kq-low")) <= {2, 3}
    assert get_job(cluster, namespace, "kq-low")["status"]["desiredReplicas"] == 3
    assert len(worker_pods(cluster, namespace, "kq-low")) == 3
    wait_for(lambda: checkpoint_step(ckpt_dir / "low") > 0, 60, "low checkpointed")

    # A higher-priority job needs 2 of the 3: Kueue preempts the low one.
    high = TrainingJob("kq-high", ckpt_dir / "high", min_replicas=2, max_replicas=2, steps=30)
    apply(cluster, namespace, _queued(high, HIGH))
    wait_for(
        lambda: (
            _condition(_workload(cluster, namespace, "kq-low"), "Evicted").get("reason")
            == "Preempted"
        ),
        120,
        "low preempted",
    )
    wait_for(lambda: not worker_pods(cluster, namespace, "kq-low"), 120, "low's pods gone")
    assert _stopped_on_sigterm(cluster, namespace, "kq-low"), "low's workers stopped gracefully"
    kept = checkpoint_step(ckpt_dir / "low")
    assert kept > 0, "the checkpoint stays"
    # Its quota reservation released: Kueue requeued it; it waits (1 pod of room < min 2).
    wait_for(
        lambda: (
            _condition(_workload(cluster, namespace, "kq-low"), "QuotaReserved").get("status")
            == "False"
        ),
        60,
        "low's quota released",
    )
    status = get_job(cluster, namespace, "kq-low")["status"]
    assert status["phase"] == "Suspended", status
    suspended = next(c for c in status["conditions"] if c["type"] == "Suspended")
    assert suspended["reason"] in ("EvictedByKueue", "WaitingForAdmission"), suspended

    # The high job runs and ends; its Workload is Finished, the quota comes free.
    wait_phase(cluster, namespace, "kq-high", "Succeeded", 300)
    wait_for(
        lambda: (
            _condition(_workload(cluster, namespace, "kq-high"), "Finished").get("status") == "True"
        ),
        60,
        "high's workload finished",
    )
    # The low job is admitted again, resumes from its checkpoint and finishes.
    wait_phase(cluster, namespace, "kq-low", "Succeeded", 400)
    resumed = [ln.step for ln in follower.lines("resumed") if ln.pod.startswith("kq-low-")]
    # Its workers saved on SIGTERM: every one resumes from exactly that step, none lost.
    assert resumed and set(resumed) == {kept}, (resumed, kept)
    reasons = [e["reason"] for e in job_events(cluster, namespace, "kq-low")]
    assert "EvictedByKueue" in reasons, reasons
    assert reasons.count("Admitted") >= 1, reasons
    assert checkpoint_step(ckpt_dir / "low") == STEPS


@pytest.mark.usefixtures("queues", "operator_proc")
def test_a_multi_role_job_gets_one_pod_set_per_role_and_runs_each_at_its_count(
    cluster: Cluster, namespace: str, follower: LogFollower, ckpt_dir: Path
) -> None:
    # Quota for 3 pods: the trainer (1:1) whole, the readers (1:4) at 2.
    trainer = TrainingJob("kq-roles", ckpt_dir, min_replicas=1, max_replicas=1, steps=80)
    reader = TrainingJob("kq-roles", ckpt_dir, min_replicas=1, max_replicas=4, steps=100000)
    roles = [role_entry("trainer", trainer), role_entry("reader", reader)]
    for entry in roles:
        (container,) = entry["template"]["spec"]["containers"]
        container["resources"] = {"requests": {"cpu": f"{POD_CPU_M}m"}}
    manifest = roles_manifest("kq-roles", *roles)
    manifest["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": QUEUE}
    apply(cluster, namespace, manifest)

    def assigned() -> dict[str, int]:
        wl = _workload(cluster, namespace, "kq-roles")
        if _condition(wl, "Admitted").get("status") != "True":
            return {}
        sets = wl["status"]["admission"]["podSetAssignments"]  # type: ignore[index]
        return {a["name"]: int(a["count"]) for a in sets}

    wait_for(lambda: assigned() == {"trainer": 1, "reader": 2}, 120, "trainer 1, reader 2")
    wl = _workload(cluster, namespace, "kq-roles")
    assert wl is not None
    asked = [(p["name"], p["count"], p.get("minCount")) for p in wl["spec"]["podSets"]]
    assert asked == [("trainer", 1, None), ("reader", 4, 1)], asked
    wait_for(
        lambda: any(
            ln.pod.startswith("kq-roles-reader-") and ln.world == 2 for ln in follower.lines("step")
        ),
        240,
        "two readers training",
    )
    names = sorted(p["metadata"]["name"] for p in worker_pods(cluster, namespace, "kq-roles"))
    assert names == ["kq-roles-reader-0", "kq-roles-reader-1", "kq-roles-trainer-0"], names
    status = get_job(cluster, namespace, "kq-roles")["status"]
    assert [(r["name"], r["desired"]) for r in status["roles"]] == [("trainer", 1), ("reader", 2)]
    admitted = [e["message"] for e in job_events(cluster, namespace, "kq-roles")
                if e["reason"] == "Admitted"]  # fmt: skip
    assert admitted and admitted[0].endswith("(trainer 1, reader 2)"), admitted
    # The trainer completes the job; its Workload is Finished, the quota comes free.
    wait_phase(cluster, namespace, "kq-roles", "Succeeded", 300)
    wait_for(
        lambda: (
            _condition(_workload(cluster, namespace, "kq-roles"), "Finished").get("status")
            == "True"
        ),
        60,
        "the workload finished",
    )
