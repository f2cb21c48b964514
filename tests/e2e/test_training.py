"""Scenarios 1, 8, 9: train to the end, isolation between jobs, plain torchrun.

Real operator process, real agents and torch workers (CPU, gloo) on the
process kubelet; assertions read the workers' logs and checkpoints.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.cluster import Cluster
from e2e.operator_proc import OperatorProcess
from e2e.trainlog import LogFollower
from e2e.workload import TrainingJob, apply, get_job, worker_pods
from tests.e2e.checks import (
    assert_progress_sound,
    checkpoint_step,
    start_etcd_pod,
    wait_event,
    wait_phase,
)
from tests.support import wait_for

# Whole training runs on a 2-core machine: more than the suite's default limit.
pytestmark = pytest.mark.timeout(600)


def test_job_trains_to_the_end_and_cleans_up(
    cluster: Cluster,
    namespace: str,
    operator_proc: OperatorProcess,
    follower: LogFollower,
    ckpt_dir: Path,
) -> None:
    job = TrainingJob("train", ckpt_dir, min_replicas=2, max_replicas=3, steps=60)
    apply(cluster, namespace, job.manifest())

    wait_phase(cluster, namespace, "train", "Succeeded", 240)

    steps = follower.lines("step")
    assert steps, "no worker logged a step"
    # One rendezvous: every rank of a 3-wide group trained to the last step.
    finals = {s.rank for s in steps if s.step == 60}
    assert finals == {0, 1, 2}, f"ranks that reached step 60: {sorted(finals)}"
    assert {s.world for s in steps} == {3}
    assert len({s.round for s in steps}) == 1, "expected a single rendezvous round"
    assert_progress_sound(follower)
    assert checkpoint_step(ckpt_dir) == 60

    status = get_job(cluster, namespace, "train")["status"]
    assert status["worldSize"] == 3
    assert status["failures"] == 0
    wait_event(cluster, namespace, "train", "Succeeded")
    # cleanPodPolicy Running: nothing is left running; finished pods stay for logs.
    wait_for(
        lambda: all(
            p.get("status", {}).get("phase") in ("Succeeded", "Failed")
            or p["metadata"].get("deletionTimestamp")
            for p in worker_pods(cluster, namespace, "train")
        ),
        60,
        "no worker pod left running",
    )
    store = cluster.kubectl("get", "pod", "train-store", "-n", namespace, check=False)
    wait_for(
        lambda: (
            cluster.kubectl("get", "pod", "train-store", "-n", namespace, check=False).returncode
            != 0
        ),
        60,
        f"the store pod removed (was: {store.stdout.strip()})",
    )


def test_jobs_sharing_one_etcd_never_see_each_other(
    cluster: Cluster,
    namespace: str,
    crd: None,
    follower: LogFollower,
    ckpt_dir: Path,
) -> None:
    other_ns = f"{namespace}-b"
    cluster.kubectl("create", "namespace", other_ns)
    log = cluster.layout.logs / f"operator-{namespace}.log"
    try:
        wait_for(
            lambda: (
                cluster.kubectl("get", "sa", "default", "-n", other_ns, check=False).returncode == 0
            ),
            30,
            "default ServiceAccount",
        )
        endpoint = start_etcd_pod(cluster, namespace, "shared-etcd")
        # Same job name in two namespaces, and a second job beside one of them,
        # all on one etcd: each rendezvous must stay its own (max 2, one pod each,
        # so any mix-up would show as a world size of 2 or 3).
        jobs = [
            (namespace, TrainingJob("twin", ckpt_dir / "a-twin", min_replicas=1, max_replicas=2,
                                    replicas=1, steps=40, backend="etcd",
                                    etcd_endpoint=endpoint)),
            (namespace, TrainingJob("other", ckpt_dir / "a-other", min_replicas=1,
                                    max_replicas=2, replicas=1, steps=40, backend="etcd",
                                    etcd_endpoint=endpoint)),
            (other_ns, TrainingJob("twin", ckpt_dir / "b-twin", min_replicas=1, max_replicas=2,
                                   replicas=1, steps=40, backend="etcd",
                                   etcd_endpoint=endpoint)),
        ]  # fmt: skip
        with (
            OperatorProcess(cluster.kubeconfig, [namespace, other_ns], log),
            LogFollower(cluster.layout.pods, other_ns) as follower_b,
        ):
            for ns, job in jobs:
                apply(cluster, ns, job.manifest())
            for ns, job in jobs:
                wait_phase(cluster, ns, job.name, "Succeeded", 300)
            ids = {_rdzv_id(cluster, ns, f"{job.name}-worker-0") for ns, job in jobs}
            steps = follower.lines("step") + follower_b.lines("step")
        by_pod: dict[str, set[int]] = {}
        for line in steps:
            by_pod.setdefault(line.pod, set()).add(line.world)
        assert set(by_pod) == {"twin-worker-0", "other-worker-0"}
        assert all(worlds == {1} for worlds in by_pod.values()), by_pod
        assert {s.step for s in follower_b.lines("step")} >= {40}
        assert len(ids) == len(jobs), f"rendezvous ids not unique: {ids}"
        for ns, job in jobs:
            assert checkpoint_step(job.ckpt_dir) == 40, f"{ns}/{job.name}"
    finally:
        cluster.kubectl("delete", "namespace", other_ns, "--wait=false", check=False)


def _rdzv_id(cluster: Cluster, namespace: str, pod: str) -> str:
    spec = cluster.get_json("pod", pod, "-n", namespace)["spec"]
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    return str(env["TORCHFLEX_RDZV_ID"])


def test_plain_torchrun_command_trains_under_the_operator(
    cluster: Cluster,
    namespace: str,
    operator_proc: OperatorProcess,
    follower: LogFollower,
    ckpt_dir: Path,
) -> None:
    job = TrainingJob("compat", ckpt_dir, min_replicas=2, max_replicas=2, steps=40,
                      torchrun=True)  # fmt: skip
    apply(cluster, namespace, job.manifest())
    wait_phase(cluster, namespace, "compat", "Succeeded", 300)
    # The pod that finished first stays; cleanPodPolicy Running removed the rest.
    pod = worker_pods(cluster, namespace, "compat")[0]
    trainer = pod["spec"]["containers"][0]
    assert trainer["command"][0] == "torchrun", "the operator must not wrap torchrun"
    assert any(e["name"] == "TORCHFLEX_RDZV_ID" for e in trainer["env"])
    steps = follower.lines("step")
    assert {s.rank for s in steps if s.step == 40} == {0, 1}
    assert {s.world for s in steps} == {2}
    assert checkpoint_step(ckpt_dir) == 40
