"""What status says about training, on the real API server: ``Training`` and its
``observedGeneration``, progress, ``Complete`` for ``kubectl wait``, and a failed
job's restarts, round and root cause from its agent's final report.

Pods run on the process node as small stand-ins for the agent (the agent has
its own tests; tests/e2e runs the real one): they serve a report on the
agent's health port, and end when the test asks them to, over HTTP on the
harness bridge, writing a final report to their termination message.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from e2e.cluster import Cluster
from tests.integration.operator.conftest import run_operator
from tests.integration.operator.jobs import (
    apply,
    condition,
    get_job,
    patch_spec,
    pods,
    process_job,
    wait_job_phase,
)
from tests.support import wait_for
from torchflex_contract import env, labels
from torchflex_contract.progress import TERMINATION_LOG
from torchflex_operator.runtime.agent_status import StatusPoller

pytestmark = pytest.mark.cluster
W = labels.worker_pod_name

# Training in round 0 at step 12 until GET /finish; then its final report, exit 0.
TRAINING_AGENT = f"""
import http.server, json, os, sys
live = dict(state="Running", round=0, world_size=1, node_rank=0, nodes=1, holds_rank0=True,
            progress=dict(step=12, steps_per_second=4.0, checkpoint_step=10, round=0))
final = dict(live, state="Succeeded")
class Agent(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps(live).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        if self.path == "/finish":
            with open({TERMINATION_LOG!r}, "w") as f:
                f.write(json.dumps(final))
            os._exit(0)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("0.0.0.0", {env.DEFAULT_HEALTH_PORT}), Agent).serve_forever()
"""


def _conditions(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (job.get("status") or {}).get("conditions") or []}


def _all_at_generation(job: dict[str, Any]) -> bool:
    gen = job["metadata"]["generation"]
    conds = _conditions(job)
    return bool(conds) and all(c.get("observedGeneration") == gen for c in conds.values())


def test_training_then_complete_with_observed_generation(
    cluster: Cluster, namespace: str, crd: None, kubeconfig_env: None
) -> None:
    name = "trains"
    poller = StatusPoller(enabled=True, timeout=1.0, interval=1.0)
    with run_operator(cluster, namespace, poller=poller):
        command = ["python", "-c", TRAINING_AGENT]
        job = process_job(name, cluster.process_node, command, minReplicas=1, maxReplicas=1)
        apply(cluster, namespace, job)

        def training() -> bool:
            cond = condition(get_job(cluster, namespace, name), "Training")
            return cond is not None and cond["status"] == "True"

        wait_for(training, 90, "condition Training=True")
        now = get_job(cluster, namespace, name)
        st, conds = now["status"], _conditions(now)
        assert conds["Training"]["reason"] == "WorkersTraining"
        assert "world size 1" in conds["Training"]["message"]
        assert conds["MinAvailable"]["status"] == "True" and st["phase"] == "Running"
        assert _all_at_generation(now), conds
        assert st["progress"]["step"] == 12 and st["progress"]["checkpointStep"] == 10
        assert st["rank0Pod"] == W(name, 0)
        row = cluster.kubectl("get", "ej", name, "-n", namespace, "--no-headers").stdout.split()
        head = cluster.kubectl("get", "ej", name, "-n", namespace).stdout.split("\n")[0].split()
        assert dict(zip(head, row, strict=True))["STEP"] == "12"

        # A spec change: every condition follows the new generation.
        before = now["metadata"]["generation"]
        patch_spec(cluster, namespace, name, ttlSecondsAfterFinished=3600)

        def caught_up() -> bool:
            job = get_job(cluster, namespace, name)
            return job["metadata"]["generation"] > before and _all_at_generation(job)

        wait_for(caught_up, 60, "every condition at the new generation")

        (pod,) = pods(cluster, namespace, name)
        url = f"http://{pod['status']['podIP']}:{env.DEFAULT_HEALTH_PORT}/finish"
        with urllib.request.urlopen(url, timeout=10) as answer:  # the bridge, not the world
            assert answer.status == 200
        # What a batch/v1 Job user types, unchanged.
        waited = cluster.kubectl(
            "wait", "--for=condition=Complete", f"ej/{name}", "-n", namespace, "--timeout=90s",
            check=False, timeout=120,
        )  # fmt: skip
        assert waited.returncode == 0, waited.stderr
        done = get_job(cluster, namespace, name)
        conds = _conditions(done)
        assert done["status"]["phase"] == "Succeeded"
        assert conds["Complete"]["status"] == "True"
        assert conds["Complete"]["reason"] == conds["Succeeded"]["reason"]
        for ctype in ("MinAvailable", "Training"):
            assert (conds[ctype]["status"], conds[ctype]["reason"]) == ("False", "JobFinished")
        assert _all_at_generation(done), conds


# Ends at once the way an agent ends when the restart budget is spent.
FAILED_AGENT = f"""
import json, sys
cause = dict(type="ValueError", message="boom", rank=0, exit_code=1, round=1,
             frames=["train.py:12 in <module>", "train.py:7 in step"])
report = dict(state="Failed", round=1, world_size=1, node_rank=0, nodes=1, restarts=2,
              message="worker failure after 1 restarts (max 1): rank 0 failed (exit code 1)",
              root_cause=cause)
with open({TERMINATION_LOG!r}, "w") as f:
    f.write(json.dumps(report))
sys.exit(1)
"""


def test_failed_job_carries_its_agents_restarts_round_and_root_cause(
    cluster: Cluster, namespace: str, crd: None, kubeconfig_env: None
) -> None:
    name = "fails"
    with run_operator(cluster, namespace):  # no live polls: the final report alone
        command = ["python", "-c", FAILED_AGENT]
        job = process_job(
            name, cluster.process_node, command, minReplicas=1, maxReplicas=1, backoffLimit=0
        )
        apply(cluster, namespace, job)
        wait_job_phase(cluster, namespace, name, "Failed", 90)
        st = get_job(cluster, namespace, name)["status"]
    assert (st["restarts"], st["rendezvousRound"]) == (2, 1), st
    cause = st["lastFailure"]["rootCause"]
    assert (cause["type"], cause["message"], cause["rank"]) == ("ValueError", "boom", 0)
    assert cause["frames"] == ["train.py:12 in <module>", "train.py:7 in step"]
    assert cause["pod"] == W(name, 0)
    assert st["lastFailure"]["message"].endswith("ValueError: boom")
    assert json.dumps(st["lastFailure"]).count("boom") == 2  # bounded: no copy beyond these
