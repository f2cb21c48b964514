"""What an operator's user scrapes and reads: metric families, the log filter, and the
``spec.replicas`` defaulting decision (all pure, no API server)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import prometheus_client as prom
import pytest

from torchflex_contract.labels import Annotation
from torchflex_operator.model.vocabulary import Phase
from torchflex_operator.planning.rules.defaulting import replicas_patch
from torchflex_operator.runtime.logsetup import CURRENT_JOB, JobLogFilter
from torchflex_operator.runtime.metrics import Metrics
from torchflex_operator.runtime.workqueue import WorkQueue

KEY = Annotation.REPLICAS_DEFAULTED.value


def job(replicas: int | None = None, maximum: int = 4, ours: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"minReplicas": 1, "maxReplicas": maximum}
    if replicas is not None:
        spec["replicas"] = replicas
    meta: dict[str, Any] = {"name": "j", "namespace": "ns"}
    if ours is not None:
        meta["annotations"] = {KEY: ours}
    return {"metadata": meta, "spec": spec}


def written(value: int) -> dict[str, Any]:
    return {"metadata": {"annotations": {KEY: str(value)}}, "spec": {"replicas": value}}


@pytest.mark.parametrize(
    ("obj", "patch"),
    [
        (job(), written(4)),  # absent: maxReplicas, marked as ours
        (job(4, ours="4"), None),  # ours and still maxReplicas: nothing to do
        (job(4, maximum=6, ours="4"), written(6)),  # ours, maxReplicas raised: follow it
        (job(4, maximum=2, ours="4"), written(2)),  # ours, maxReplicas lowered: follow it
        (job(3, ours="4"), {"metadata": {"annotations": {KEY: None}}}),  # scaled: theirs now
        (job(3), None),  # the user's own value
        (job(4), None),  # the user's own value that happens to be maxReplicas
        ({"metadata": {}, "spec": {}}, None),  # invalid: the planner reports it
    ],
    ids=[
        "absent",
        "ours-current",
        "ours-raised",
        "ours-lowered",
        "scaled",
        "users",
        "users-max",
        "invalid",
    ],
)
def test_replicas_patch(obj: dict[str, Any], patch: dict[str, Any] | None) -> None:
    assert replicas_patch(obj) == patch


def exposition(metrics: Metrics) -> list[str]:
    return prom.generate_latest(metrics.registry).decode().splitlines()


def test_metric_families_have_codes_queue_and_per_job_counters_and_no_created() -> None:
    metrics = Metrics()
    queue: WorkQueue[tuple[str, str]] = WorkQueue()
    jobs: dict[tuple[str, str], dict[str, Any]] = {
        ("ns", "a"): {"status": {"failures": 2, "replacements": 3, "restarts": 1}},
        ("ns", "b"): {"metadata": {}},  # before its first status write
    }
    metrics.instrument(queue, lambda: jobs)
    metrics.api_request("create", "201")
    metrics.api_request("create", "409")
    metrics.api_request("get", "<error>")
    metrics.reconciles.labels("ok").inc()
    metrics.latency.observe(0.1)
    lines = exposition(metrics)
    names = {line.split("{")[0].split(" ")[0] for line in lines if not line.startswith("#")}
    assert not [name for name in names if name.endswith("_created")]
    assert "torchflex_reconcile_total" in names
    assert 'torchflex_api_requests_total{code="201",verb="create"} 1.0' in lines
    assert 'torchflex_api_requests_total{code="409",verb="create"} 1.0' in lines
    assert 'torchflex_api_requests_total{code="<error>",verb="get"} 1.0' in lines
    assert 'torchflex_job_failures_total{name="a",namespace="ns"} 2.0' in lines
    assert 'torchflex_job_replacements_total{name="a",namespace="ns"} 3.0' in lines
    assert 'torchflex_job_restarts_total{name="a",namespace="ns"} 1.0' in lines
    assert 'torchflex_job_restarts_total{name="b",namespace="ns"} 0.0' in lines
    assert "# TYPE torchflex_job_failures_total counter" in lines
    assert "torchflex_workqueue_depth 0.0" in lines
    assert "torchflex_workqueue_queue_duration_seconds_count 0.0" in lines
    del jobs[("ns", "a")]  # a deleted job's series go with it
    assert not [line for line in exposition(metrics) if 'name="a"' in line]


def test_per_job_sizes_progress_phase_and_conditions_from_the_job_objects() -> None:
    metrics = Metrics()
    restarting = {
        "spec": {"minReplicas": 2, "maxReplicas": 4},
        "status": {
            "phase": "Restarting",
            "readyReplicas": 1,
            "desiredReplicas": 4,
            "worldSize": 2,
            "rendezvousRound": 3,
            "progress": {"step": 120, "stepsPerSecond": 9.5, "checkpointStep": 110},
            "conditions": [
                {"type": "MinAvailable", "status": "False", "reason": "BelowMinReplicas"},
                {"type": "RendezvousStoreReachable", "status": "True"},
                {"type": "Training", "status": "Unknown"},
                {"type": "SomeoneElses", "status": "True"},
            ],
        },
    }
    jobs: dict[tuple[str, str], dict[str, Any]] = {
        ("ns", "a"): restarting,
        ("ns", "b"): {"spec": {"minReplicas": 1, "maxReplicas": True}, "status": {"phase": "X"}},
    }
    metrics.instrument(WorkQueue(), lambda: jobs)
    lines = exposition(metrics)
    a = '{name="a",namespace="ns"}'
    for sample in (
        f"torchflex_job_min_replicas{a} 2.0",
        f"torchflex_job_max_replicas{a} 4.0",
        f"torchflex_job_ready_replicas{a} 1.0",
        f"torchflex_job_desired_replicas{a} 4.0",
        f"torchflex_job_world_size{a} 2.0",
        f"torchflex_job_rendezvous_round{a} 3.0",
        f"torchflex_job_step{a} 120.0",
        f"torchflex_job_steps_per_second{a} 9.5",
        f"torchflex_job_checkpoint_step{a} 110.0",
        'torchflex_job_phase{name="a",namespace="ns",phase="Restarting"} 1.0',
        'torchflex_job_phase{name="a",namespace="ns",phase="Running"} 0.0',
        'torchflex_job_condition{condition="MinAvailable",name="a",namespace="ns"} 0.0',
        'torchflex_job_condition{condition="RendezvousStoreReachable",name="a",namespace="ns"} 1.0',
    ):
        assert sample in lines, sample
    # One sample per phase of the closed vocabulary; Unknown and foreign conditions none.
    phases = [ln for ln in lines if ln.startswith("torchflex_job_phase{")]
    assert len(phases) == len(Phase)
    conditions = [ln for ln in lines if ln.startswith("torchflex_job_condition{")]
    assert len(conditions) == 2
    # Job b: an unknown phase and a value of the wrong type publish nothing, never a guess.
    b_lines = [ln for ln in lines if 'name="b"' in ln and not ln.startswith("#")]
    assert sorted(ln.split("{")[0] for ln in b_lines) == [
        "torchflex_job_failures_total",
        "torchflex_job_min_replicas",
        "torchflex_job_replacements_total",
        "torchflex_job_restarts_total",
    ]
    assert "# TYPE torchflex_job_phase gauge" in lines


def test_workqueue_depth_counts_due_keys_and_latency_is_observed() -> None:
    async def scenario() -> tuple[list[float], list[int]]:
        waits: list[float] = []
        q: WorkQueue[str] = WorkQueue()
        q.on_wait = waits.append
        q.add("a")
        q.add("b")
        q.add("later", 60)
        depths = [q.ready()]
        q.done(await asyncio.wait_for(q.get(), 1))
        depths.append(q.ready())
        return waits, depths

    waits, depths = asyncio.run(scenario())
    assert depths == [2, 1]  # the delayed key is not backlog
    assert len(waits) == 1 and waits[0] >= 0


def record(logger: str, message: str) -> logging.LogRecord:
    return logging.LogRecord(logger, logging.INFO, __file__, 1, message, None, None)


def test_log_filter_drops_handler_chatter_and_names_the_job() -> None:
    quiet, verbose = JobLogFilter(verbose=False), JobLogFilter(verbose=True)
    succeeded = record("kopf.objects", "Handler 'pod_event' succeeded.")
    assert not quiet.filter(succeeded) and verbose.filter(succeeded)
    ours = record("torchflex_operator.runtime.reconcile", "reconcile ns/j: conflict")
    token = CURRENT_JOB.set(("ns", "j"))  # as a reconcile worker sets it for one pass
    try:
        assert quiet.filter(ours)
    finally:
        CURRENT_JOB.reset(token)
    # kopf's JSON format writes k8s_ref as "object" (the integration test reads it).
    assert getattr(ours, "k8s_ref") == {  # noqa: B009 - set by the filter, not a LogRecord field
        "apiVersion": "torchflex.io/v1alpha1",
        "kind": "ElasticJob",
        "namespace": "ns",
        "name": "j",
    }
    outside = record("torchflex_operator.cli", "starting")
    assert quiet.filter(outside) and not hasattr(outside, "k8s_ref")
