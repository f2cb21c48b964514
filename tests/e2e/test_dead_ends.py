"""Issue 12's dead ends, end to end: every failure path recovers or fails fast with the reason.

Each scenario hung for many minutes before (or failed with a misleading
reason): a job whose whole round died waited out the join timeout once per
replacement; a command that does not exist crashed the agent and was
retried as an infrastructure error; an agent that could not reach its store
ignored SIGTERM until the pod's grace period ran out. Here each runs on the
local control plane with the real operator, real agents and real pods, and
every wait is bounded far below the old failure mode's duration.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import Cluster
from e2e.operator_proc import OperatorProcess, sigkill_pod_processes, wait_gone
from e2e.trainlog import LogFollower
from e2e.workload import TrainingJob, apply, get_job, worker_pods
from tests.e2e.checks import (
    assert_progress_sound,
    checkpoint_step,
    current_round,
    event_reasons,
    wait_phase,
    wait_reformed,
    wait_training,
)
from tests.support import wait_for

pytestmark = pytest.mark.timeout(600)


def condition(status: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c.get("type") == ctype), None)


def test_whole_round_killed_trains_again_at_once(
    cluster: Cluster,
    namespace: str,
    operator_proc: OperatorProcess,
    follower: LogFollower,
    ckpt_dir: Path,
) -> None:
    """min = max = 2, both pods' processes SIGKILLed while the store lives: the replacement
    agents must see that round N's members are gone and open round N+1, not wait on it for
    the join timeout (600 s) once per replacement."""
    job = TrainingJob("whole", ckpt_dir, min_replicas=2, max_replicas=2, steps=120)
    apply(cluster, namespace, job.manifest())
    wait_training(follower, 20, 240, world=2)

    round_at_kill = current_round(follower)
    pids = [pid for i in range(2) for pid in sigkill_pod_processes(namespace, f"whole-worker-{i}")]
    assert pids, "no processes found for the job's pods"
    assert wait_gone(pids), "killed processes still alive"

    # Far below the join timeout: the replacements trained in a new round.
    _, world = wait_reformed(follower, round_at_kill, 150)
    assert world == 2
    wait_phase(cluster, namespace, "whole", "Succeeded", 300)
    assert_progress_sound(follower)
    assert checkpoint_step(ckpt_dir) == 120
    status = get_job(cluster, namespace, "whole")["status"]
    assert status["replacements"] >= 2


def test_command_that_does_not_exist_fails_fast_naming_it(
    cluster: Cluster,
    namespace: str,
    operator_proc: OperatorProcess,
    ckpt_dir: Path,
) -> None:
    """A user error, said as one: no crash, no retry, the command in the job's status."""
    job = TrainingJob(
        "badcmd", ckpt_dir, min_replicas=2, max_replicas=2, script="/nonexistent/train.py"
    )
    apply(cluster, namespace, job.manifest())
    wait_phase(cluster, namespace, "badcmd", "Failed", 120)

    status = get_job(cluster, namespace, "badcmd")["status"]
    failed = condition(status, "Failed")
    assert failed is not None and failed["status"] == "True", status
    assert failed["reason"] == "BadCommand", failed
    assert "/nonexistent/train.py" in failed["message"], failed
    assert status["lastFailure"]["exitCode"] == 127, status["lastFailure"]
    # Nothing that cannot work was retried, nor announced as about to be.
    reasons = event_reasons(cluster, namespace, "badcmd")
    assert "ReplacedPod" not in reasons and "BackingOff" not in reasons, reasons


def test_agent_that_cannot_reach_its_store_says_so_and_stops_on_sigterm(
    cluster: Cluster,
    namespace: str,
    operator_proc: OperatorProcess,
    ckpt_dir: Path,
) -> None:
    """An etcd endpoint nobody serves (the pod's own loopback): the job's status says the
    store is unreachable, with the cause, and deleting a pod ends its agent on SIGTERM
    instead of at the end of a 60 s grace period."""
    job = TrainingJob(
        "nostore",
        ckpt_dir,
        min_replicas=1,
        max_replicas=1,
        backend="etcd",
        etcd_endpoint="http://127.0.0.1:9",
        grace_s=60,
    )
    apply(cluster, namespace, job.manifest())

    def unreachable() -> dict[str, Any] | None:
        status = get_job(cluster, namespace, "nostore").get("status") or {}
        cond = condition(status, "RendezvousStoreReachable")
        return cond if cond is not None and cond["status"] == "False" else None

    wait_for(unreachable, 90, "RendezvousStoreReachable=False on the job")
    cond = unreachable()
    assert cond is not None and "127.0.0.1:9" in cond["message"], cond
    assert get_job(cluster, namespace, "nostore")["status"]["phase"] != "Succeeded"

    (pod,) = [p for p in worker_pods(cluster, namespace, "nostore")]
    uid = pod["metadata"]["uid"]
    started = time.monotonic()
    cluster.kubectl("delete", "pod", pod["metadata"]["name"], "-n", namespace, "--wait=false")

    def gone() -> bool:
        return all(p["metadata"]["uid"] != uid for p in worker_pods(cluster, namespace, "nostore"))

    # Bounded well inside the 60 s grace: only an agent that handles SIGTERM ends by then.
    wait_for(gone, 30, "the deleted pod gone before its grace period ran out")
    assert time.monotonic() - started < 60
