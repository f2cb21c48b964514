"""The optional PrometheusRule: absent by default; with the flag, rules promtool accepts,
that read only series the operator exports, and whose alerts fire, and stay quiet, as
``promtool test rules`` plays made-up series through them.

promtool is built from Prometheus' Go module on first use and cached (``promtool.py``);
a cold build takes minutes, hence this module's longer timeout.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.install.chart import NAMESPACE, VALUE_SETS, find, one, render
from tests.unit.install.promql import exported_series, metric_names
from tests.unit.install.promtool import BUILD_TIMEOUT_S, promtool_path
from torchflex_operator.model.vocabulary import ConditionType, Phase

pytestmark = pytest.mark.timeout(BUILD_TIMEOUT_S + 300)

ALERT_LABELS = {"team": "ml-platform"}  # the monitoring value set's alertLabels
JOB = {"namespace": "ml", "name": "bert"}


def rule_spec() -> dict[str, Any]:
    spec: dict[str, Any] = one(render(VALUE_SETS["monitoring"]), "PrometheusRule")["spec"]
    return spec


def rules(spec: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for group in spec["groups"] for r in group["rules"]}


@pytest.fixture(scope="module")
def promtool() -> Path:
    return promtool_path()


@pytest.fixture(scope="module")
def rule_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rules") / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule_spec()["groups"]}))
    return path


def run(promtool: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def test_no_rule_unless_asked_for() -> None:
    for name, values in VALUE_SETS.items():
        asked = values.get("metrics", {}).get("prometheusRule", {}).get("enabled", False)
        assert bool(find(render(values), "PrometheusRule")) is asked, name


def test_the_rule_object_is_selected_like_the_service_monitor() -> None:
    rule = one(render(VALUE_SETS["monitoring"]), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == NAMESPACE
    assert rule["metadata"]["labels"]["release"] == "prom"
    for alert in rules(rule["spec"]).values():
        assert ALERT_LABELS.items() <= alert["labels"].items()
        assert alert["labels"]["severity"] in ("critical", "warning")


def test_every_alert_reads_only_series_the_operator_exports() -> None:
    exported = exported_series()
    words = {"phase": {p.value for p in Phase}, "condition": {c.value for c in ConditionType}}
    for name, alert in rules(rule_spec()).items():
        names = metric_names(alert["expr"])
        assert names and names <= exported, f"{name}: {sorted(names - exported)} not exported"
        for label, value in re.findall(r'\b(phase|condition)\s*=\s*"([^"]*)"', alert["expr"]):
            assert value in words[label], f"{name}: {label}={value!r} is no operator word"


def test_promtool_accepts_the_rules(promtool: Path, rule_file: Path) -> None:
    out = run(promtool, "check", "rules", rule_file.name, cwd=rule_file.parent)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(rules(rule_spec()))} rules found" in out.stdout


def expand(template: str, labels: Mapping[str, str]) -> str:
    """The rule's annotation as Prometheus fills it in (only ``$labels.X`` is used)."""
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m[1]], template)


def fired(alert: Mapping[str, Any], labels: Mapping[str, str]) -> dict[str, Any]:
    """promtool's expectation of ``alert`` firing for series ``labels``."""
    return {
        "exp_labels": {**alert["labels"], **labels},
        "exp_annotations": {k: expand(v, labels) for k, v in alert["annotations"].items()},
    }


def scenario(
    series: dict[str, str], checks: list[tuple[str, str, list[Mapping[str, str]]]]
) -> dict[str, Any]:
    """One promtool test: ``series`` (selector -> values) and (time, alert, the label
    sets it fires for; none: quiet)."""
    alerts = rules(rule_spec())
    return {
        "interval": "1m",
        "input_series": [{"series": s, "values": v} for s, v in series.items()],
        "alert_rule_test": [
            {
                "eval_time": at,
                "alertname": name,
                "exp_alerts": [fired(alerts[name], labels) for labels in firing],
            }
            for at, name, firing in checks
        ],
    }


def sel(metric: str, /, **labels: str) -> str:
    return metric + "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


OP = {"namespace": NAMESPACE}
OTHER = {"namespace": "ml", "name": "gpt"}


def scenarios() -> list[dict[str, Any]]:
    phase = "torchflex_job_phase"
    return [
        # Below its minimum for 5m pages; a running job beside it does not.
        scenario(
            {
                sel(phase, **JOB, phase="Restarting"): "1x10",
                sel(phase, **OTHER, phase="Restarting"): "0x10",
                sel(phase, **OTHER, phase="Running"): "1x10",
            },
            [
                ("4m", "TorchflexJobBelowMinimum", []),
                ("6m", "TorchflexJobBelowMinimum", [JOB]),
            ],
        ),
        # Back to Running after 3 minutes below: never pages.
        scenario(
            {sel(phase, **JOB, phase="Restarting"): "1 1 1 0 0 0 0 0 0 0"},
            [("9m", "TorchflexJobBelowMinimum", [])],
        ),
        scenario(
            {sel(phase, **JOB, phase="Pending"): "1x40"},
            [("29m", "TorchflexJobNotStarting", []), ("31m", "TorchflexJobNotStarting", [JOB])],
        ),
        # Three replacements within 30 minutes warn; one does not.
        scenario(
            {
                sel("torchflex_job_replacements_total", **JOB): "0 0 1 2 3 3 3",
                sel("torchflex_job_replacements_total", **OTHER): "0 0 1 1 1 1 1",
            },
            [("2m", "TorchflexJobReplacingPods", []), ("6m", "TorchflexJobReplacingPods", [JOB])],
        ),
        scenario(
            {
                sel("torchflex_job_condition", **JOB, condition="RendezvousStoreReachable"): "0x5",
                sel("torchflex_job_condition", **OTHER, condition="RendezvousStoreReachable"): (
                    "1x5"
                ),
                sel("torchflex_job_condition", **OTHER, condition="MinAvailable"): "0x5",
            },
            [
                ("1m", "TorchflexRendezvousStoreUnreachable", []),
                ("3m", "TorchflexRendezvousStoreUnreachable", [JOB]),
            ],
        ),
        # One leader, one standby: quiet. A leader elsewhere does not count here.
        scenario(
            {
                sel("torchflex_active", **OP, pod="a"): "1x10",
                sel("torchflex_active", **OP, pod="b"): "0x10",
            },
            [
                ("6m", "TorchflexOperatorNotLeading", []),
                ("6m", "TorchflexOperatorTwoLeaders", []),
            ],
        ),
        scenario(
            {
                sel("torchflex_active", **OP, pod="a"): "0x10",
                sel("torchflex_active", namespace="elsewhere", pod="c"): "1x10",
            },
            [
                ("4m", "TorchflexOperatorNotLeading", []),
                ("6m", "TorchflexOperatorNotLeading", [{}]),
            ],
        ),
        # No operator scraped at all pages too.
        scenario(
            {sel("torchflex_workqueue_depth", namespace="elsewhere"): "0x10"},
            [("6m", "TorchflexOperatorNotLeading", [{}])],
        ),
        scenario(
            {
                sel("torchflex_active", **OP, pod="a"): "1x10",
                sel("torchflex_active", **OP, pod="b"): "1x10",
            },
            [("6m", "TorchflexOperatorTwoLeaders", [{}])],
        ),
        scenario(
            {
                sel("torchflex_reconcile_total", **OP, result="error"): "0+1x30",
                sel("torchflex_reconcile_total", **OP, result="ok"): "0+5x30",
            },
            [
                ("10m", "TorchflexOperatorReconcileErrors", []),
                ("20m", "TorchflexOperatorReconcileErrors", [{}]),
            ],
        ),
        scenario(
            {sel("torchflex_reconcile_total", **OP, result="ok"): "0+5x30"},
            [("20m", "TorchflexOperatorReconcileErrors", [])],
        ),
    ]


def test_alerts_fire_when_they_should_and_only_then(promtool: Path, rule_file: Path) -> None:
    tested = {check["alertname"] for s in scenarios() for check in s["alert_rule_test"]}
    assert tested == set(rules(rule_spec())), "every alert has a scenario"
    tests = rule_file.parent / "tests.yaml"
    tests.write_text(
        yaml.safe_dump(
            {"rule_files": [rule_file.name], "evaluation_interval": "1m", "tests": scenarios()}
        )
    )
    out = run(promtool, "test", "rules", tests.name, cwd=rule_file.parent)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_promtool_catches_a_wrong_expectation(promtool: Path, rule_file: Path) -> None:
    """The harness is not vacuous: an alert expected where the series say otherwise fails."""
    wrong = scenario(
        {sel("torchflex_job_phase", **JOB, phase="Restarting"): "0x10"},
        [("6m", "TorchflexJobBelowMinimum", [JOB])],
    )
    tests = rule_file.parent / "wrong.yaml"
    tests.write_text(
        yaml.safe_dump(
            {"rule_files": [rule_file.name], "evaluation_interval": "1m", "tests": [wrong]}
        )
    )
    out = run(promtool, "test", "rules", tests.name, cwd=rule_file.parent)
    assert out.returncode != 0 and "TorchflexJobBelowMinimum" in out.stdout + out.stderr
