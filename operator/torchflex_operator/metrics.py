"""Prometheus metrics of the operator.

Where it sits: one ``Metrics`` per operator run (its own registry, so tests
can start the operator twice in one process); the reconciler records,
``cli`` serves it on ``--metrics-port``.
"""

from __future__ import annotations

import prometheus_client as prom

from torchflex_operator.vocabulary import Phase


class Metrics:
    def __init__(self) -> None:
        self.registry = prom.CollectorRegistry()
        r = self.registry
        self.reconciles = prom.Counter(
            "torchflex_reconcile_total", "Reconcile passes by result", ["result"], registry=r
        )
        self.latency = prom.Histogram(
            "torchflex_reconcile_duration_seconds",
            "Duration of one reconcile pass",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.pods_created = prom.Counter(
            "torchflex_pods_created_total", "Pods created, by role", ["role"], registry=r
        )
        self.pods_deleted = prom.Counter(
            "torchflex_pods_deleted_total", "Pods deleted, by kind", ["kind"], registry=r
        )
        self.pods_replaced = prom.Counter(
            "torchflex_pods_replaced_total",
            "Failed worker pods replaced, by reason",
            ["reason"],
            registry=r,
        )
        self.jobs = prom.Gauge("torchflex_jobs", "ElasticJobs by phase", ["phase"], registry=r)
        self.api_requests = prom.Counter(
            "torchflex_api_requests_total",
            "Requests the reconciler sent to the API server (kopf's watches not included)",
            ["verb"],
            registry=r,
        )
        self.active = prom.Gauge(
            "torchflex_active", "1 while this replica reconciles, 0 while standby", registry=r
        )
        self._phase: dict[tuple[str, str], str] = {}

    def job_phase(self, key: tuple[str, str], phase: str | None) -> None:
        if phase is None:
            self._phase.pop(key, None)
        else:
            self._phase[key] = phase
        for p in Phase:
            self.jobs.labels(p.value).set(sum(1 for v in self._phase.values() if v == p))

    def serve(self, port: int) -> None:
        prom.start_http_server(port, registry=self.registry)
