"""What HPA-style readers, Prometheus and a log pipeline see of the operator, on the real
API server: the scale subresource of a job created without ``spec.replicas``, the
``/metrics`` of a real ``torchflex-operator`` process, and its JSON log."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import Cluster
from e2e.localproc import free_port
from e2e.operator_proc import OperatorProcess
from tests.integration.operator.conftest import run_operator
from tests.integration.operator.jobs import apply, get_job, kwok_job, patch_spec
from tests.support import wait_for
from torchflex_contract.labels import Annotation

pytestmark = pytest.mark.cluster
DEFAULTED = Annotation.REPLICAS_DEFAULTED.value
SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?P<labels>.*)\})? (?P<value>\S+)$")


def scale(cluster: Cluster, namespace: str, name: str) -> tuple[int, dict[str, Any], str]:
    """``GET .../elasticjobs/NAME/scale``: exit code, the Scale object, stderr."""
    out = cluster.kubectl(
        "get", "ej", name, "-n", namespace, "--subresource=scale", "-o", "json", check=False
    )
    return out.returncode, json.loads(out.stdout) if out.returncode == 0 else {}, out.stderr


def settled(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    """The job once the operator's status reflects its latest generation, else None."""
    job = get_job(cluster, namespace, name)
    seen = (job.get("status") or {}).get("observedGeneration")
    return job if seen == job["metadata"]["generation"] else None


def test_scale_subresource_of_a_job_without_replicas_answers_once_the_operator_ran(
    cluster: Cluster, namespace: str, crd: None, kubeconfig_env: None
) -> None:
    cluster.kwok_nodes(2, prefix="op-kwok")
    name = "noreplicas"
    apply(cluster, namespace, kwok_job(name, minReplicas=1, maxReplicas=3))
    # Before any operator: the API server itself cannot answer (what issue 15 saw).
    code, _, err = scale(cluster, namespace, name)
    assert code != 0 and "does not exist" in err, err
    with run_operator(cluster, namespace):
        wait_for(lambda: scale(cluster, namespace, name)[0] == 0, 60, "the scale subresource")
        _, obj, _ = scale(cluster, namespace, name)
        assert obj["spec"]["replicas"] == 3
        assert obj["status"]["selector"].startswith("torchflex.io/job-name=")
        job = get_job(cluster, namespace, name)
        assert job["metadata"]["annotations"][DEFAULTED] == "3"
        # Lowering maxReplicas past the written value is accepted (unchanged
        # replicas is not re-validated) and the written value follows it.
        patch_spec(cluster, namespace, name, maxReplicas=2)
        wait_for(
            lambda: scale(cluster, namespace, name)[1].get("spec", {}).get("replicas") == 2,
            60,
            "spec.replicas following maxReplicas",
        )
        # A scale makes the value the user's: it no longer follows maxReplicas.
        cluster.kubectl("scale", "ej", name, "-n", namespace, "--replicas=1")
        wait_for(
            lambda: (
                DEFAULTED
                not in (get_job(cluster, namespace, name)["metadata"].get("annotations") or {})
            ),
            60,
            "the annotation to go once the user scaled",
        )
        patch_spec(cluster, namespace, name, maxReplicas=3)
        wait_for(lambda: settled(cluster, namespace, name), 60, "the operator to see maxReplicas=3")
        job = get_job(cluster, namespace, name)
        assert job["spec"]["replicas"] == 1
        assert job["status"]["desiredReplicas"] == 1
        assert scale(cluster, namespace, name)[1]["spec"]["replicas"] == 1
    # Scaling out of range is still refused.
    out = cluster.kubectl("scale", "ej", name, "-n", namespace, "--replicas=4", check=False)
    assert out.returncode != 0 and "spec.replicas" in out.stderr, out.stderr


def samples(port: int) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample ``/metrics`` serves; [] while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as rsp:
            text = rsp.read().decode()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m and not line.startswith("#"):
            pairs = re.findall(r'(\w+)="([^"]*)"', m.group("labels") or "")
            out.append((m.group("name"), dict(pairs), float(m.group("value"))))
    return out


def test_metrics_and_json_log_of_a_running_operator(
    cluster: Cluster, namespace: str, crd: None, tmp_path: Path
) -> None:
    cluster.kwok_nodes(2, prefix="op-kwok")
    port = free_port()
    log_path = tmp_path / "operator.log"
    operator = OperatorProcess(
        cluster.kubeconfig,
        [namespace],
        log_path,
        ["--log-format", "json", "--agent-command", "env"],
        metrics_port=port,
    ).start()
    name = "observed"
    try:
        apply(cluster, namespace, kwok_job(name, minReplicas=1, maxReplicas=2))
        wait_for(
            lambda: (
                (get_job(cluster, namespace, name).get("status") or {}).get("readyReplicas") == 2
            ),
            90,
            "two ready workers",
        )
        wait_for(
            lambda: any(n == "torchflex_job_failures_total" for n, _, _ in samples(port)),
            30,
            "per-job series",
        )
        scraped = samples(port)
    finally:
        operator.stop()
    names = {n for n, _, _ in scraped}
    assert not [n for n in names if n.endswith("_created")], sorted(names)
    requests = [(labels, v) for n, labels, v in scraped if n == "torchflex_api_requests_total"]
    assert requests and all(set(labels) == {"verb", "code"} for labels, _ in requests), requests
    assert any(labels == {"verb": "create", "code": "201"} for labels, _ in requests), requests
    assert {
        "torchflex_workqueue_depth",
        "torchflex_workqueue_queue_duration_seconds_count",
    } <= names
    taken = [v for n, _, v in scraped if n == "torchflex_workqueue_queue_duration_seconds_count"]
    assert taken[0] >= 1
    mine = {"namespace": namespace, "name": name}
    for series in ("torchflex_job_failures_total", "torchflex_job_replacements_total",
                   "torchflex_job_restarts_total"):  # fmt: skip
        assert [v for n, labels, v in scraped if n == series and labels == mine] == [0.0], series
    # The job's sizes, phase and conditions, as the dashboard and the alerts read them.
    for series, value in (("torchflex_job_min_replicas", 1.0), ("torchflex_job_max_replicas", 2.0),
                          ("torchflex_job_ready_replicas", 2.0)):  # fmt: skip
        assert [v for n, labels, v in scraped if n == series and labels == mine] == [value], series
    phases = {
        labels["phase"]: v
        for n, labels, v in scraped
        if n == "torchflex_job_phase" and labels.items() >= mine.items()
    }
    assert phases["Running"] == 1.0 and sum(phases.values()) == 1.0, phases
    conditions = {
        labels["condition"]: v
        for n, labels, v in scraped
        if n == "torchflex_job_condition" and labels.items() >= mine.items()
    }
    assert conditions["MinAvailable"] == 1.0, conditions

    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    assert lines, log_path.read_text()[-2000:]
    chatter = [entry for entry in lines if re.match(r"Handler '.*' succeeded", entry["message"])]
    assert not chatter, chatter[:3]
    about_job = [entry for entry in lines if entry.get("object", {}).get("kind") == "ElasticJob"]
    assert about_job, lines[-20:]
    assert all(
        entry["object"]["namespace"] == namespace and entry["object"]["name"] == name
        for entry in about_job
    ), about_job[:3]
    assert any(
        "CreatedPod" in entry["message"] or "ScaledUp" in entry["message"] for entry in about_job
    )
