"""Prometheus metrics of the operator (the table is in docs/operations.md).

Where it sits: one ``Metrics`` per operator run (its own registry, so tests
can start the operator twice in one process); the reconciler records,
``Kube`` reports each API request with its status code, ``instrument`` hooks
the work queue and the per-job series (``JobSeries``: counters, sizes, the
step, the phase and the conditions, read from the jobs' own objects at scrape
time, so they survive an operator restart); ``cli`` serves it on
``--metrics-port``. Every series is in ``Metrics.registry``: the chart's
dashboard and alert rules are tested against it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import prometheus_client as prom
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from torchflex_operator.model.status import ConditionStatus
from torchflex_operator.model.vocabulary import ConditionType, Phase
from torchflex_operator.runtime.workqueue import WorkQueue

JobKey = tuple[str, str]
JOB_LABELS = ["namespace", "name"]
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
# Per-job gauges: path in the job object -> (metric name, help). A job without the
# value publishes no sample (a step of 0 would read as progress lost).
JOB_GAUGES: dict[tuple[str, ...], tuple[str, str]] = {
    ("spec", "minReplicas"): ("torchflex_job_min_replicas", "The job's spec.minReplicas"),
    ("spec", "maxReplicas"): ("torchflex_job_max_replicas", "The job's spec.maxReplicas"),
    ("status", "desiredReplicas"): (
        "torchflex_job_desired_replicas",
        "Worker pods the operator aims for (status.desiredReplicas)",
    ),
    ("status", "readyReplicas"): (
        "torchflex_job_ready_replicas",
        "Worker pods neither terminating nor finished that are Ready (status.readyReplicas)",
    ),
    ("status", "worldSize"): (
        "torchflex_job_world_size",
        "Members of the latest rendezvous round the agents report (status.worldSize)",
    ),
    ("status", "rendezvousRound"): (
        "torchflex_job_rendezvous_round",
        "Latest rendezvous round the agents report; it grows at each re-formation",
    ),
    ("status", "progress", "step"): (
        "torchflex_job_step",
        "Latest training step the workers reported (status.progress.step)",
    ),
    ("status", "progress", "stepsPerSecond"): (
        "torchflex_job_steps_per_second",
        "Training speed the workers last reported (status.progress.stepsPerSecond)",
    ),
    ("status", "progress", "checkpointStep"): (
        "torchflex_job_checkpoint_step",
        "Step of the latest checkpoint the workers reported (status.progress.checkpointStep)",
    ),
}
PHASE_METRIC = ("torchflex_job_phase", "1 for the job's status.phase, 0 for the other phases")
CONDITION_METRIC = (
    "torchflex_job_condition",
    "1 while the job's condition is True, 0 while False (absent while Unknown or unset)",
)
CONDITION_VALUES: dict[str, float] = {ConditionStatus.TRUE: 1.0, ConditionStatus.FALSE: 0.0}
# Until ``instrument`` hands the reconciler's jobs over, there are none to publish.
NO_JOBS: Callable[[], Mapping[JobKey, Mapping[str, Any]]] = dict


def _number(obj: Mapping[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = obj
    for key in path:
        value = value.get(key) if isinstance(value, Mapping) else None
    # JSON true is no number, though Python's bool is an int.
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _phase_samples(family: GaugeMetricFamily, labels: list[str], status: Mapping[str, Any]) -> None:
    if status.get("phase") in set(Phase):  # an unknown word of another version: no sample
        for phase in Phase:
            family.add_metric([*labels, phase.value], 1.0 if status["phase"] == phase else 0.0)


def _condition_samples(
    family: GaugeMetricFamily, labels: list[str], status: Mapping[str, Any]
) -> None:
    known = {c.value for c in ConditionType}
    for cond in status.get("conditions") or []:
        if not isinstance(cond, Mapping) or cond.get("type") not in known:
            continue
        value = CONDITION_VALUES.get(str(cond.get("status")))
        if value is not None:
            family.add_metric([*labels, cond["type"]], value)


class JobSeries:
    """Collector of the per-job series, from the latest job objects at scrape time."""

    def __init__(self) -> None:
        self.jobs = NO_JOBS

    def collect(self) -> Iterator[Metric]:
        counters = {
            field: CounterMetricFamily(name, text, labels=JOB_LABELS)
            for field, (name, text) in JOB_COUNTERS.items()
        }
        gauges = {
            path: GaugeMetricFamily(name, text, labels=JOB_LABELS)
            for path, (name, text) in JOB_GAUGES.items()
        }
        phases = GaugeMetricFamily(*PHASE_METRIC, labels=[*JOB_LABELS, "phase"])
        conditions = GaugeMetricFamily(*CONDITION_METRIC, labels=[*JOB_LABELS, "condition"])
        jobs = dict(self.jobs())  # one C-level copy: the scrape runs in the server's thread
        for (namespace, name), obj in sorted(jobs.items()):
            labels = [namespace, name]
            status = obj.get("status") or {}
            for field, counter in counters.items():
                value = status.get(field)
                counter.add_metric(labels, float(value if isinstance(value, int) else 0))
            for path, gauge in gauges.items():
                number = _number(obj, path)
                if number is not None:
                    gauge.add_metric(labels, number)
            _phase_samples(phases, labels, status)
            _condition_samples(conditions, labels, status)
        yield from counters.values()
        yield from gauges.values()
        yield phases
        yield conditions


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
        self.job_series = JobSeries()
        r.register(self.job_series)
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
        """Measure ``queue`` and publish the per-job series of the jobs ``jobs`` returns."""
        queue.on_wait = self.queue_latency.observe
        self.queue_depth.set_function(lambda: float(queue.ready()))
        self.job_series.jobs = jobs

    def serve(self, port: int) -> None:
        prom.start_http_server(port, registry=self.registry)
