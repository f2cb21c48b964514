"""Bad values fail ``helm template`` with a message naming the value and the fix.

The JSON schema (values.schema.json) catches types, enums, ranges and typos;
the chart's ``torchflex.validate`` catches the cross-field rules.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.install.chart import render_error

CASES: list[tuple[str, dict[str, Any], list[str]]] = [
    ("zero replicas", {"replicaCount": 0}, ["/replicaCount", "minimum"]),
    ("replicas as text", {"replicaCount": "two"}, ["/replicaCount", "integer"]),
    ("unknown mode", {"watch": {"mode": "some"}}, ["/watch/mode", "cluster", "namespaced"]),
    ("typo in a key", {"replicas": 2}, ["replicas"]),
    ("typo nested", {"operator": {"worker": 2}}, ["/operator", "worker"]),
    (
        "glob namespace",
        {"watch": {"mode": "namespaced", "namespaces": ["team-*"]}},
        ["/watch/namespaces/0"],
    ),
    ("latest tag", {"image": {"tag": "latest"}}, ['image.tag: "latest" is refused']),
    ("bad digest", {"image": {"digest": "sha256:xyz"}}, ["/image/digest"]),
    ("port out of range", {"metrics": {"port": 70000}}, ["/metrics/port", "maximum"]),
    ("log format", {"operator": {"logFormat": "xml"}}, ["/operator/logFormat", "json", "plain"]),
    ("zero workers", {"operator": {"workers": 0}}, ["/operator/workers", "minimum"]),
    (
        "root operator",
        {"podSecurityContext": {"runAsNonRoot": False}},
        ["/podSecurityContext/runAsNonRoot"],
    ),
    (
        "privilege escalation",
        {"securityContext": {"allowPrivilegeEscalation": True}},
        ["/securityContext/allowPrivilegeEscalation"],
    ),
    ("leader election value", {"leaderElection": {"enabled": "yes"}}, ["/leaderElection/enabled"]),
    ("old peering value", {"peering": {"enabled": "yes"}}, ["/peering/enabled"]),
    (
        "renew deadline not shorter than the lease",
        {"leaderElection": {"leaseDurationSeconds": 10, "renewDeadlineSeconds": 10}},
        ["renewDeadlineSeconds must be shorter than leaseDurationSeconds"],
    ),
    (
        "renew deadline without room for a retry",
        {"leaderElection": {"renewDeadlineSeconds": 2, "retryPeriodSeconds": 2}},
        ["must exceed 1.2 x retryPeriodSeconds"],
    ),
    ("lease too short", {"leaderElection": {"leaseDurationSeconds": 1}}, ["/leaderElection"]),
    (
        "alert rules without metrics",
        {"metrics": {"enabled": False, "prometheusRule": {"enabled": True}}},
        ["metrics.prometheusRule.enabled needs metrics.enabled"],
    ),
    (
        "alert duration",
        {"metrics": {"prometheusRule": {"belowMinimumFor": "five minutes"}}},
        ["/metrics/prometheusRule/belowMinimumFor"],
    ),
    (
        "alert replacements",
        {"metrics": {"prometheusRule": {"replacements": 0}}},
        ["/metrics/prometheusRule/replacements", "minimum"],
    ),
    (
        "dashboard label value",
        {"metrics": {"grafanaDashboard": {"labels": {"grafana_dashboard": 1}}}},
        ["/metrics/grafanaDashboard/labels/grafana_dashboard"],
    ),
    (
        "servicemonitor without metrics",
        {"metrics": {"enabled": False, "serviceMonitor": {"enabled": True}}},
        ["metrics.serviceMonitor.enabled needs metrics.enabled"],
    ),
    (
        "servicemonitor interval",
        {"metrics": {"serviceMonitor": {"interval": "30 seconds"}}},
        ["/metrics/serviceMonitor/interval"],
    ),
    (
        "namespaced without namespaces",
        {"watch": {"mode": "namespaced"}},
        ["watch.namespaces: list at least one namespace"],
    ),
    (
        "namespaces in cluster mode",
        {"watch": {"mode": "cluster", "namespaces": ["a"]}},
        ["watch.namespaces: must be empty", "watch.mode=namespaced"],
    ),
    (
        "replicas without leader election",
        {"replicaCount": 2, "leaderElection": {"enabled": False}},
        ["replicaCount > 1 needs leader election"],
    ),
    (
        "replicas with the old peering off",
        {"replicaCount": 2, "peering": {"enabled": False}},
        ["replicaCount > 1 needs leader election"],
    ),
    (
        "pdb blocking drains",
        {"podDisruptionBudget": {"enabled": True, "minAvailable": 1}},
        ["podDisruptionBudget.minAvailable must be lower than replicaCount"],
    ),
    (
        "existing SA without name",
        {"serviceAccount": {"create": False}},
        ["serviceAccount.name is required"],
    ),
]


@pytest.mark.parametrize(("values", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_values_fail_with_a_clear_message(values: dict[str, Any], expected: list[str]) -> None:
    message = render_error(values)
    for part in expected:
        assert part in message, message
