"""Scenario 15 (issue 26): a member of the final round whose worker never exits.

Every process stays alive and every agent heartbeats, so no liveness rule
fires: before this, such a job sat in ``Completing`` forever. Here the real
operator, real agents and real torch workers train to the last step, then
rank 1's worker blocks in native code (libc ``pause()`` in an ``atexit``
handler) after its script returned. Its agent must end it after the teardown
grace with its stack recorded, and the job must succeed, with the stack in
``status.hungWorkers`` and a ``WorkerHung`` Event.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.cluster import Cluster
from e2e.workload import TrainingJob, apply, get_job
from tests.e2e.checks import checkpoint_step, wait_event, wait_phase

pytestmark = pytest.mark.timeout(600)


@pytest.mark.usefixtures("operator_proc")
def test_member_hung_at_exit_is_ended_and_the_job_completes(
    cluster: Cluster, namespace: str, ckpt_dir: Path
) -> None:
    name, steps = "hang", 40
    job = TrainingJob(
        name,
        ckpt_dir,
        min_replicas=2,
        max_replicas=2,
        steps=steps,
        script="tests/e2e/hang_at_exit_train.py",
        extra_env=(("HANG_RANK", "1"), ("TORCHFLEX_TEARDOWN_GRACE", "2")),
    )
    apply(cluster, namespace, job.manifest())
    wait_phase(cluster, namespace, name, "Succeeded", 300)

    status = get_job(cluster, namespace, name)["status"]
    hung = status.get("hungWorkers") or []
    assert len(hung) == 1, status
    entry = hung[0]
    assert entry["kind"] == "Teardown" and entry["rank"] == 1, entry
    assert entry["seconds"] >= 2, entry
    # faulthandler's dump of the blocked worker names the handler it is stuck in.
    assert "hang_forever_in_teardown" in entry["stack"], entry["stack"]
    succeeded = next(c for c in status["conditions"] if c["type"] == "Succeeded")
    assert "hung in teardown" in succeeded["message"], succeeded
    assert entry["pod"] in succeeded["message"], succeeded
    wait_event(cluster, namespace, name, "WorkerHung")
    assert checkpoint_step(ckpt_dir) == steps
