"""What a user reads in the job's status: the real exception of a failed job, and
the step a training script reports, in status and in `kubectl get ej`.

Real operator process, real agents on the process kubelet: the first script
is plain Python that raises ``ValueError("boom")`` (its agent records the
exception), the second the example trainer, which reports each step through
``torchflex_agent.progress.report_step``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import Cluster
from e2e.operator_proc import OperatorProcess
from e2e.workload import TrainingJob, apply, get_job, worker_pods
from tests.e2e.checks import wait_phase
from tests.support import wait_for
from torchflex_contract import labels
from torchflex_contract.progress import AgentReport

# A torch import on a 2-core machine: more than the suite's default limit.
pytestmark = pytest.mark.timeout(600)


def _final_reports(cluster: Cluster, namespace: str, name: str) -> list[AgentReport]:
    """The agents' final reports, from the pods' termination messages."""
    out = []
    for pod in worker_pods(cluster, namespace, name):
        for cs in pod.get("status", {}).get("containerStatuses") or []:
            message = ((cs.get("state") or {}).get("terminated") or {}).get("message")
            if message:
                out.append(AgentReport.from_json(message))
    return out


def test_worker_exception_is_the_failed_jobs_root_cause(
    cluster: Cluster, namespace: str, operator_proc: OperatorProcess, ckpt_dir: Path
) -> None:
    job = TrainingJob(
        "boom",
        ckpt_dir,
        min_replicas=1,
        max_replicas=1,
        max_restarts=1,
        backoff_limit=0,
        script="tests/e2e/boom_train.py",
    )
    apply(cluster, namespace, job.manifest())
    wait_phase(cluster, namespace, "boom", "Failed", 240)

    status: dict[str, Any] = get_job(cluster, namespace, "boom")["status"]
    last = status["lastFailure"]
    cause = last["rootCause"]
    assert (cause["type"], cause["message"]) == ("ValueError", "boom"), last
    assert cause["rank"] == 0 and cause["pod"] == labels.worker_pod_name("boom", 0)
    assert cause["frames"] and "boom_train.py" in cause["frames"][-1], cause["frames"]
    assert "in step" in cause["frames"][-1]  # innermost last: where it was raised
    assert "ValueError: boom" in last["message"]
    # The counts the agent ended with, not 0 / -1: its final report's.
    (final,) = _final_reports(cluster, namespace, "boom")
    assert final.restarts >= 1  # maxRestarts 1: restarted once in place, then gave up
    assert (status["restarts"], status["rendezvousRound"]) == (final.restarts, final.round)
    assert final.round >= 0


def _column(cluster: Cluster, namespace: str, name: str, column: str) -> str:
    lines = cluster.kubectl("get", "ej", name, "-n", namespace).stdout.splitlines()
    head, row = lines[0].split(), lines[1].split()
    return dict(zip(head, row, strict=False)).get(column, "")


def test_reported_steps_show_in_status_and_the_step_column(
    cluster: Cluster, namespace: str, operator_proc: OperatorProcess, ckpt_dir: Path
) -> None:
    job = TrainingJob(
        "steps", ckpt_dir, min_replicas=1, max_replicas=1, steps=2000, step_time_s=0.1
    )
    apply(cluster, namespace, job.manifest())

    def progress() -> dict[str, Any]:
        status = get_job(cluster, namespace, "steps").get("status") or {}
        return dict(status.get("progress") or {})

    wait_for(lambda: progress().get("step", 0) > 0, 300, "status.progress.step > 0")
    status = get_job(cluster, namespace, "steps")["status"]
    training = next(c for c in status["conditions"] if c["type"] == "Training")
    assert training["status"] == "True", status["conditions"]
    assert status["rank0Pod"] == labels.worker_pod_name("steps", 0)
    assert status["progress"]["pod"] == status["rank0Pod"]
    wait_for(
        lambda: (
            _column(cluster, namespace, "steps", "STEP").isdigit()
            and int(_column(cluster, namespace, "steps", "STEP")) > 0
        ),
        60,
        "kubectl get ej shows a STEP > 0",
    )
