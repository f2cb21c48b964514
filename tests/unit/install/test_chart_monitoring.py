"""The optional ServiceMonitor: absent by default, and with the flag one that scrapes
exactly the metrics Service's port (the Prometheus Operator's selection rules)."""

from __future__ import annotations

from tests.unit.install.chart import NAMESPACE, VALUE_SETS, find, one, render


def test_no_service_monitor_unless_asked_for() -> None:
    for name, values in VALUE_SETS.items():
        asked = values.get("metrics", {}).get("serviceMonitor", {}).get("enabled", False)
        assert bool(find(render(values), "ServiceMonitor")) is asked, name


def test_service_monitor_selects_the_metrics_service_and_port() -> None:
    docs = render(VALUE_SETS["monitoring"])
    monitor = one(docs, "ServiceMonitor")
    service = one(docs, "Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == NAMESPACE
    # The label a Prometheus selects ServiceMonitors by is added to the release's labels.
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["metadata"]["labels"]["app.kubernetes.io/instance"] == "tf"
    spec = monitor["spec"]
    assert spec["namespaceSelector"] == {"matchNames": [service["metadata"]["namespace"]]}
    selector = spec["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    # Nothing else the release makes is a Service it could pick up by mistake.
    assert len(find(docs, "Service")) == 1
    port_names = [p["name"] for p in service["spec"]["ports"]]
    assert spec["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "honorLabels": True, "interval": "30s"}
    ]
    assert "metrics" in port_names
