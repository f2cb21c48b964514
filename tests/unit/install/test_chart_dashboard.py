"""The optional Grafana dashboard: absent by default, the chart's JSON file in a ConfigMap
with the flag, and every query it runs reads only series the operator exports."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.unit.install.chart import CHART, NAMESPACE, VALUE_SETS, find, one, render
from tests.unit.install.promql import exported_series, metric_names, template_query_names
from torchflex_operator.model.vocabulary import ConditionType, Phase

DASHBOARD = CHART / "dashboards" / "torchflex.json"


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for panel in board["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # a collapsed row keeps its panels inside
    return out


def queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target."""
    return [
        (f"panel {p['id']} {p['title']!r} {t['refId']}", t["expr"])
        for p in panels(board)
        for t in p.get("targets", [])
    ]


def template_queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]
            out.append(
                (f"variable {var['name']}", query["query"] if isinstance(query, dict) else query)
            )
    return out


def test_no_dashboard_unless_asked_for() -> None:
    for name, values in VALUE_SETS.items():
        asked = values.get("metrics", {}).get("grafanaDashboard", {}).get("enabled", False)
        assert bool(find(render(values), "ConfigMap")) is asked, name


def test_the_config_map_holds_the_chart_dashboard_for_the_sidecar() -> None:
    docs = render(VALUE_SETS["monitoring"])
    cm = one(docs, "ConfigMap")
    assert cm["metadata"]["namespace"] == "monitoring"  # the value set's sidecar namespace
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["labels"]["app.kubernetes.io/instance"] == "tf"
    assert json.loads(cm["data"]["torchflex.json"]) == dashboard()
    # Far below a ConfigMap's 1 MiB, and below kubectl apply's 256 KiB annotation too.
    assert len(cm["data"]["torchflex.json"]) < 256 * 1024
    default_ns = one(render({"metrics": {"grafanaDashboard": {"enabled": True}}}), "ConfigMap")
    assert default_ns["metadata"]["namespace"] == NAMESPACE


def test_every_query_reads_only_series_the_operator_exports() -> None:
    board = dashboard()
    exported = exported_series()
    found = [*queries(board), *template_queries(board)]
    assert len(found) >= 20
    unknown: list[str] = []
    read: set[str] = set()
    for where, expr in found:
        reader = template_query_names if where.startswith("variable") else metric_names
        names = reader(expr)
        assert names, f"{where} reads no series: {expr}"
        read |= names
        unknown += [f"{where}: {n}" for n in sorted(names - exported)]
    assert not unknown, "the dashboard names series the operator does not export:\n" + "\n".join(
        unknown
    )
    # Every per-job series has a panel; the operator's own ones too.
    assert {n for n in exported if n.startswith("torchflex_job")} <= read
    assert {"torchflex_active", "torchflex_reconcile_total", "torchflex_jobs"} <= read


def test_phase_and_condition_values_are_the_operators_words() -> None:
    words = {"phase": {p.value for p in Phase}, "condition": {c.value for c in ConditionType}}
    for where, expr in queries(dashboard()):
        for label, value in re.findall(r'\b(phase|condition)\s*=\s*"([^"]*)"', expr):
            assert value in words[label], f"{where}: {label}={value!r} is no operator word"


def test_panels_are_well_formed() -> None:
    board = dashboard()
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    assert board["uid"] == "torchflex"
    names = {v["name"] for v in board["templating"]["list"]}
    for p in panels(board):
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert {"x", "y", "w", "h"} <= p["gridPos"].keys() and p["gridPos"]["x"] + p["gridPos"][
            "w"
        ] <= 24
        for target in p["targets"]:
            used = set(re.findall(r"\$(\w+)", target["expr"])) - {"__rate_interval"}
            assert used <= names, f"{p['title']}: undefined variables {used - names}"


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("rate(torchflex_nope_total[5m])", {"torchflex_nope_total"}),
        ('sum by (le) (x_bucket{a="b"}) / on (le) group_left (c) y', {"x_bucket", "y"}),
        ("histogram_quantile(0.99, z) > 1e3 offset 5m", {"z"}),
        ('label_replace(v, "dst", "$1", "src", "(.*)")', {"v"}),
    ],
)
def test_metric_names_of_an_expression(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names
