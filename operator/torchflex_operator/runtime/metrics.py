"""Prometheus metrics of the operator (the table is in docs/operations.md).

Where it sits: one ``Metrics`` per operator run (its own registry, so tests
can start the operator twice in one process); the reconciler records,
``Kube`` reports each API request with its status code, ``instrument`` hooks
the work queue and the per-job series (read from the jobs' own status at
scrape time, so they survive an operator restart), ``cli`` serves it on
``--metrics-port``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import prometheus_client as prom
from prometheus_client.core import CounterMetricFamily, Metric

from torchflex_operator.model.vocabulary import Phase
from torchflex_operator.runtime.workqueue import WorkQueue

JobKey = tuple[str, str]
# Per-job counters: status field -> (metric name without _total, help).
JOB_COUNTERS: dict[str, tuple[str, str]] = {
    "failures": ("torchflex_job_failures", "Counted pod failures of the job (status.failures)"),
    "replacements": (
        "torchflex_job_replacements",
        "Failed worker pods the operator replaced (status.replacements)",
    ),
    "restarts": (
        "torchflex_job_restarts",
        "In-place worker-group restarts the agents report (status.restarts)",
    ),
}
# Until ``instrument`` hands the reconciler's jobs over, there are none to publish.
NO_JOBS: Callable[[], Mapping[JobKey, Mapping[str, Any]]] = dict


class JobCounters:
    """Collector of the per-job counters, from the latest job objects at scrape time."""

    def __init__(self) -> None:
        self.jobs = NO_JOBS

    def collect(self) -> Iterator[Metric]:
        families = {
            field: CounterMetricFamily(name, text, labels=["namespace", "name"])
            for field, (name, text) in JOB_COUNTERS.items()
        }
        jobs = dict(self.jobs())  # one C-level copy: the scrape runs in the server's thread
        for (namespace, name), obj in sorted(jobs.items()):
            status = obj.get("status") or {}
            for field, family in families.items():
                value = status.get(field)
                family.add_metric([namespace, name], float(value if isinstance(value, int) else 0))
        yield from families.values()


class Metrics:
    def __init__(self) -> None:
        # Counters' and histograms' ``*_created`` series (Unix time of the first
        # sample) double the output and no query uses them. prometheus_client
        # only has a process-wide switch; the operator's process is ours.
        prom.disable_created_metrics()  # type: ignore[no-untyped-call]
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
            "Requests the reconciler sent to the API server (kopf's watches not included), "
            "by verb and HTTP status code (<error>: no response)",
            ["verb", "code"],
            registry=r,
        )
        self.queue_depth = prom.Gauge(
            "torchflex_workqueue_depth", "Job keys due now and waiting for a worker", registry=r
        )
        self.queue_latency = prom.Histogram(
            "torchflex_workqueue_queue_duration_seconds",
            "How long a due job key waited in the work queue before a worker took it",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60),
            registry=r,
        )
        self.job_counters = JobCounters()
        r.register(self.job_counters)
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

    def api_request(self, verb: str, code: str) -> None:
        """``Kube``'s ``on_request``: one request sent, and how it was answered."""
        self.api_requests.labels(verb, code).inc()

    def instrument(
        self, queue: WorkQueue[Any], jobs: Callable[[], Mapping[JobKey, Mapping[str, Any]]]
    ) -> None:
        """Measure ``queue`` and publish per-job counters of the jobs ``jobs`` returns."""
        queue.on_wait = self.queue_latency.observe
        self.queue_depth.set_function(lambda: float(queue.ready()))
        self.job_counters.jobs = jobs

    def serve(self, port: int) -> None:
        prom.start_http_server(port, registry=self.registry)
