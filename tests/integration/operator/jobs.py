"""ElasticJob manifests and readers for the operator's integration tests."""

from __future__ import annotations

import json
from typing import Any

import yaml

from e2e.cluster import Cluster
from tests.support import wait_for
from torchflex_contract import env, labels

KWOK_TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}
SLEEP = ["python", "-c", "import time; time.sleep(300)"]


def fake_agent(report: str, before: str = "") -> str:
    """Source (for ``python -c``) of a pod that answers the operator's polls like an agent.

    It serves the JSON of ``report`` (a Python expression) at ``/status`` and
    "ok" elsewhere on the agent's health port; ``before`` (top-level Python
    lines, no indentation) runs first and may name what ``report`` uses.
    """
    return f"""
import http.server, json, os, sys, time
{before}
report = json.dumps({report}).encode()
class Status(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = report if self.path == "/status" else b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("0.0.0.0", {env.DEFAULT_HEALTH_PORT}), Status).serve_forever()
"""


def kwok_job(name: str, **spec: Any) -> dict[str, Any]:
    """Pods on kwok's fake nodes: they run without processes."""
    pod_spec = {
        "nodeSelector": {"type": "kwok"},
        "tolerations": [KWOK_TOLERATION],
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "trainer", "image": "fake", "command": SLEEP}],
    }
    return _job(name, pod_spec, spec)


def process_job(name: str, node: str, command: list[str], **spec: Any) -> dict[str, Any]:
    """Pods on the process node: the command really runs."""
    pod_spec = {
        "nodeSelector": {"kubernetes.io/hostname": node},
        "terminationGracePeriodSeconds": 2,
        "containers": [{"name": "trainer", "image": "local", "command": command}],
    }
    spec.setdefault("rendezvous", {"backend": "etcd", "endpoint": "http://127.0.0.1:2379"})
    return _job(name, pod_spec, spec)


def _job(name: str, pod_spec: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": labels.API_VERSION,
        "kind": labels.KIND,
        "metadata": {"name": name},
        "spec": {"template": {"spec": pod_spec}, **spec},
    }


def apply(cluster: Cluster, namespace: str, job: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(job))


def get_job(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return cluster.get_json("elasticjob", name, "-n", namespace)


def job_status(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    """The job's status ({} before the operator wrote one)."""
    return dict(get_job(cluster, namespace, name).get("status") or {})


def wait_job_phase(
    cluster: Cluster, namespace: str, name: str, phase: str, timeout_s: float
) -> None:
    """Wait (bounded) until the job's phase is ``phase``; fails the test otherwise."""
    wait_for(
        lambda: job_status(cluster, namespace, name).get("phase") == phase,
        timeout_s,
        f"job {name} {phase}",
    )


def pods(cluster: Cluster, namespace: str, name: str, role: str = "worker") -> list[dict[str, Any]]:
    out = cluster.kubectl(
        "get",
        "pods",
        "-n",
        namespace,
        "-o",
        "json",
        "-l",
        f"{labels.Label.JOB_NAME}={name},{labels.Label.ROLE}={role}",
    )
    items: list[dict[str, Any]] = json.loads(out.stdout)["items"]
    return items


def live_workers(cluster: Cluster, namespace: str, name: str) -> dict[str, str]:
    """Worker pod name -> uid, for pods not being deleted."""
    return {
        p["metadata"]["name"]: p["metadata"]["uid"]
        for p in pods(cluster, namespace, name)
        if not p["metadata"].get("deletionTimestamp")
    }


def _job_events(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    out = cluster.kubectl(
        "get",
        "events",
        "-n",
        namespace,
        "-o",
        "json",
        "--field-selector",
        f"involvedObject.name={name},involvedObject.kind={labels.KIND}",
    )
    items: list[dict[str, Any]] = json.loads(out.stdout)["items"]
    return items


def events(cluster: Cluster, namespace: str, name: str) -> list[str]:
    return [e["reason"] for e in _job_events(cluster, namespace, name)]


def event_messages(cluster: Cluster, namespace: str, name: str) -> list[tuple[str, str]]:
    """(reason, message) of every Event on the job, oldest first."""
    items = sorted(
        _job_events(cluster, namespace, name), key=lambda e: e.get("firstTimestamp") or ""
    )
    return [(e["reason"], e.get("message", "")) for e in items]


def patch_spec(cluster: Cluster, namespace: str, name: str, **spec: Any) -> None:
    body = json.dumps({"spec": spec})
    cluster.kubectl("patch", "ej", name, "-n", namespace, "--type=merge", "-p", body)


def condition(job: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    conds = (job.get("status") or {}).get("conditions") or []
    return next((c for c in conds if c.get("type") == ctype), None)
