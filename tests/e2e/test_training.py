"""Scenarios 1, 8, 9: train to the end, isolation between jobs, plain torchrun.

Real operator process, real agents and torch workers (CPU, gloo) on the
process kubelet; assertions read the workers' logs and checkpoints.
"""

from __future__ import annotations

from pathlib import Path

from e2e.cluster import Cluster
from e2e.operator_proc import OperatorProcess
from e2e.trainlog import LogFollower
from e2e.workload import TrainingJob, apply, get_job, worker_pods
from tests.e2e.checks import assert_progress_sound, checkpoint_step, event_reasons, wait_phase
from tests.support import wait_for


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
    assert "Succeeded" in event_reasons(cluster, namespace, "train")
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
