"""What status says about training: ``Training``, ``Complete``, idle conditions,
``observedGeneration``, root causes, final reports' counts and progress (pure)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest

from tests.unit.operator.factories import (
    NOW,
    ago,
    decided,
    job,
    job_obj,
    observed,
    parsed,
    worker,
    written,
)
from torchflex_contract import labels
from torchflex_contract.progress import AgentReport, AgentState, Progress, RootCause
from torchflex_operator.model.observed import PodView
from torchflex_operator.model.settings import Settings
from torchflex_operator.model.spec import JobSpec
from torchflex_operator.model.status import JobStatus, TrainingProgress, WorkerException
from torchflex_operator.model.vocabulary import ConditionType, Phase, Reason
from torchflex_operator.planning import plan
from torchflex_operator.planning.rules.activity import group_state
from torchflex_operator.planning.rules.failures import root_cause

RUNNING: dict[str, Any] = {"phase": "Running", "startTime": ago(10), "desiredReplicas": 2}
W0, W1, W2 = (labels.worker_pod_name("demo", i) for i in range(3))


def report(state: AgentState = AgentState.RUNNING, rnd: int = 3, **kw: Any) -> AgentReport:
    kw.setdefault("world_size", 2)
    return AgentReport(state=state, round=rnd, **kw)


def cond(status: dict[str, Any], ctype: ConditionType) -> dict[str, Any]:
    found = [c for c in status.get("conditions", []) if c["type"] == ctype.value]
    assert found, f"no {ctype.value} in {status.get('conditions')}"
    return dict(found[0])


def has_cond(status: dict[str, Any], ctype: ConditionType) -> bool:
    return any(c["type"] == ctype.value for c in status.get("conditions", []))


# --- Training -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pods", "reports", "training", "reason"),
    [
        pytest.param(
            [worker(0, "Pending")], {}, False, Reason.NO_WORKERS_RUNNING, id="no-pod-running"
        ),
        pytest.param([worker(0)], {}, False, Reason.AGENTS_STARTING, id="running-no-report"),
        pytest.param(
            [worker(0), worker(1)],
            {W0: report(AgentState.RENDEZVOUS, -1), W1: report(AgentState.INIT, -1)},
            False,
            Reason.AGENTS_STARTING,
            id="first-rendezvous-not-complete",
        ),
        pytest.param(
            [worker(0), worker(1)],
            {W0: report(), W1: report()},
            True,
            Reason.WORKERS_TRAINING,
            id="all-of-the-newest-round-run-workers",
        ),
        pytest.param(
            [worker(0), worker(1), worker(2)],
            {W0: report(), W1: report(), W2: report(AgentState.RENDEZVOUS, -1)},
            True,
            Reason.WORKERS_TRAINING,
            id="a-joiner-waiting-does-not-stop-the-group",
        ),
        pytest.param(
            [worker(0), worker(1)],
            {W0: report(), W1: report(AgentState.RESTARTING)},
            False,
            Reason.WORKERS_RESTARTING,
            id="a-worker-failed-group-restarts",
        ),
        pytest.param(
            [worker(0), worker(1)],
            {W0: report(AgentState.RENDEZVOUS), W1: report()},
            False,
            Reason.RENDEZVOUSING,
            id="round-over-re-forming",
        ),
        pytest.param(
            [worker(0), worker(1)],
            {W0: report(AgentState.RUNNING, 2), W1: report(AgentState.RENDEZVOUS, 3)},
            False,
            Reason.RENDEZVOUSING,
            id="the-newest-round-decides",
        ),
        pytest.param(
            [worker(0), worker(1)],
            {W0: report(AgentState.SUCCEEDED), W1: report()},
            False,
            Reason.COMPLETING,
            id="an-agent-finished",
        ),
        pytest.param(
            [worker(0), worker(1, "Succeeded")],
            {W0: report(), W1: report(AgentState.SUCCEEDED)},
            True,
            Reason.WORKERS_TRAINING,
            id="only-running-pods-count",
        ),
    ],
)
def test_group_state(
    pods: list[PodView], reports: dict[str, AgentReport], training: bool, reason: Reason
) -> None:
    state = group_state(pods, reports)
    assert (state.training, state.reason) == (training, reason), state.message


def test_training_condition_says_since_when_and_the_world_size() -> None:
    obs = observed(worker(0), worker(1), reports={W0: report(), W1: report()})
    first = plan(job(replicas=2), parsed(RUNNING), obs, NOW)
    got = cond(written(first), ConditionType.TRAINING)
    assert (got["status"], got["reason"]) == ("True", Reason.WORKERS_TRAINING)
    assert "world size 2" in got["message"] and "round 3" in got["message"]
    assert got["lastTransitionTime"] == ago(0)
    later = plan(job(replicas=2), decided(first), obs, NOW + dt.timedelta(seconds=30))
    assert cond(written(later), ConditionType.TRAINING)["lastTransitionTime"] == ago(0)
    # Running (pods) stays as it is while the agents still start.
    starting = plan(job(replicas=2), parsed(RUNNING), observed(worker(0), worker(1)), NOW)
    assert written(starting)["phase"] == Phase.RUNNING
    assert cond(written(starting), ConditionType.TRAINING)["reason"] == Reason.AGENTS_STARTING


def test_every_condition_carries_the_generation_it_was_decided_from() -> None:
    obj = job_obj(replicas=2)
    obj["metadata"]["generation"] = 7
    kept = {**_true(ConditionType.STORE_REACHABLE, Reason.STORE_REACHABLE), "observedGeneration": 6}
    prior = parsed({**RUNNING, "conditions": [kept]})
    result = plan(JobSpec.parse(obj), prior, observed(worker(0), worker(1)), NOW)
    conds = written(result)["conditions"]
    assert {c["type"] for c in conds} >= {"RendezvousStoreReachable", "Training", "MinAvailable"}
    assert {c["observedGeneration"] for c in conds} == {7}  # kept ones too: weighed again
    assert written(result)["observedGeneration"] == 7


# --- a job that runs nothing ----------------------------------------------------


def _true(ctype: ConditionType, reason: Reason) -> dict[str, Any]:
    return {"type": ctype.value, "status": "True", "reason": reason.value, "message": "m",
            "lastTransitionTime": ago(60)}  # fmt: skip


def test_a_succeeded_job_is_complete_and_nothing_stays_available() -> None:
    reports = {
        W0: report(AgentState.SUCCEEDED, nodes=2, node_rank=0),
        W1: report(AgentState.SUCCEEDED, nodes=2, node_rank=1),
    }
    prior = {
        **RUNNING,
        "conditions": [
            _true(ConditionType.MIN_AVAILABLE, Reason.MIN_REPLICAS_RUNNING),
            _true(ConditionType.AT_DESIRED_SIZE, Reason.DESIRED_SIZE_RUNNING),
        ],
    }
    obs = observed(worker(0, "Succeeded"), worker(1, "Succeeded"), reports=reports)
    status = written(plan(job(replicas=2), parsed(prior), obs, NOW))
    assert status["phase"] == Phase.SUCCEEDED
    succeeded, complete = (
        cond(status, ConditionType.SUCCEEDED),
        cond(status, ConditionType.COMPLETE),
    )
    assert complete == {**succeeded, "type": "Complete"}
    assert complete["status"] == "True" and complete["observedGeneration"] == 1
    for ctype in (
        ConditionType.MIN_AVAILABLE,
        ConditionType.AT_DESIRED_SIZE,
        ConditionType.TRAINING,
    ):
        got = cond(status, ctype)
        assert (got["status"], got["reason"]) == ("False", Reason.JOB_FINISHED), ctype
        assert got["message"] == "the job succeeded; nothing runs"


def test_a_job_an_older_operator_finished_gets_complete_and_loses_min_available() -> None:
    done = _true(ConditionType.SUCCEEDED, Reason.WORKER_GROUP_SUCCEEDED)
    prior = {
        "phase": "Succeeded",
        "completionTime": ago(30),
        "conditions": [_true(ConditionType.MIN_AVAILABLE, Reason.MIN_REPLICAS_RUNNING), done],
    }
    status = written(plan(job(), parsed(prior), observed(), NOW))
    assert cond(status, ConditionType.COMPLETE) == {
        **done,
        "type": "Complete",
        "observedGeneration": 1,
    }
    assert cond(status, ConditionType.MIN_AVAILABLE)["status"] == "False"


def test_a_failed_job_keeps_the_false_min_available_that_failed_it() -> None:
    prior = {**RUNNING, "belowMinSince": ago(700)}
    status = written(plan(job(), parsed(prior), observed(worker(0, "Pending")), NOW))
    assert cond(status, ConditionType.FAILED)["reason"] == Reason.MIN_AVAILABLE_TIMEOUT
    assert cond(status, ConditionType.MIN_AVAILABLE)["reason"] == Reason.BELOW_MIN_REPLICAS
    assert cond(status, ConditionType.TRAINING)["reason"] == Reason.JOB_FINISHED
    assert not has_cond(status, ConditionType.COMPLETE)  # as batch/v1: Failed only


def test_a_suspended_job_trains_nothing_and_is_not_available() -> None:
    prior = {
        **RUNNING,
        "conditions": [_true(ConditionType.MIN_AVAILABLE, Reason.MIN_REPLICAS_RUNNING)],
    }
    status = written(plan(job(suspend=True), parsed(prior), observed(worker(0), worker(1)), NOW))
    assert status["phase"] == Phase.SUSPENDED
    for ctype in (ConditionType.MIN_AVAILABLE, ConditionType.TRAINING):
        got = cond(status, ctype)
        assert (got["status"], got["reason"]) == ("False", Reason.SUSPENDED_BY_USER), ctype


# --- a failed job's counts and root cause ---------------------------------------

BOOM = RootCause("ValueError", "boom", ("train.py:3 in <module>", "train.py:9 in step"), 0, 1, 1)


def _final(rep: AgentReport) -> str:
    return rep.to_json()


def test_a_failed_job_carries_its_agents_final_restarts_round_and_root_cause() -> None:
    mine = report(AgentState.FAILED, 1, restarts=2, root_cause=BOOM, message="rank 0 failed")
    peer = report(AgentState.FAILED, 1, restarts=2, message="job failed: see rank 0")
    obs = observed(
        worker(0, "Failed", exit_code=1, uid="f0", message=_final(mine)),
        worker(1, "Failed", exit_code=1, uid="f1", message=_final(peer)),
        reports={W0: mine, W1: peer},  # the reconciler reads final reports into these
    )
    status = decided(plan(job(backoffLimit=0), parsed(RUNNING), obs, NOW))
    assert status.phase is Phase.FAILED
    assert (status.restarts, status.rendezvous_round) == (2, 1)
    last = status.last_failure
    assert last is not None and last.pod == W1  # the later pod; the cause is rank 0's
    assert last.root_cause == WorkerException(
        "ValueError", "boom", ("train.py:3 in <module>", "train.py:9 in step"), 0, 1, W0
    )
    assert last.message.endswith("ValueError: boom")  # named even where the agent did not
    failed = written(plan(job(backoffLimit=0), parsed(RUNNING), obs, NOW))
    assert "ValueError: boom" in cond(failed, ConditionType.FAILED)["message"]


SHOWN = WorkerException("ValueError", "boom", (), 0, 4, "demo-worker-0")


@pytest.mark.parametrize(
    ("rep", "shown", "want"),
    [
        pytest.param(None, SHOWN, None, id="no-final-report-no-cause"),
        pytest.param(
            report(AgentState.FAILED, 4, root_cause=dataclasses.replace(BOOM, round=4)),
            None,
            dataclasses.replace(SHOWN, frames=BOOM.frames, pod="p"),
            id="its-own-of-the-round-it-ended-in",
        ),
        pytest.param(
            report(AgentState.FAILED, 5, root_cause=dataclasses.replace(BOOM, round=4)),
            None,
            None,
            id="its-own-older-one-was-handled-by-a-restart",
        ),
        pytest.param(report(AgentState.FAILED, 4), SHOWN, SHOWN, id="a-peer-of-that-round"),
        pytest.param(report(AgentState.FAILED, 5), SHOWN, None, id="a-later-round-is-another"),
        pytest.param(report(AgentState.FAILED, -1), SHOWN, None, id="never-in-a-round"),
    ],
)
def test_root_cause(
    rep: AgentReport | None, shown: WorkerException | None, want: WorkerException | None
) -> None:
    assert root_cause("p", rep, shown) == want


# --- progress --------------------------------------------------------------------


def _progress(step: int, rnd: int = 3, **kw: Any) -> Progress:
    return Progress(step=step, round=rnd, **kw)


def test_progress_and_rank0_pod_come_from_the_reports() -> None:
    reports = {
        W0: report(node_rank=1, progress=_progress(40, steps_per_second=2.5, checkpoint_step=30)),
        W1: report(node_rank=0, holds_rank0=True, progress=_progress(41, steps_per_second=2.5)),
    }
    obs = observed(worker(0), worker(1), reports=reports)
    status = decided(plan(job(replicas=2), parsed(RUNNING), obs, NOW))
    assert status.rank0_pod == W1  # not index 0: node ranks follow rendezvous order
    assert status.progress == TrainingProgress(41, 2.5, None, 3, W1, NOW)
    out = written(plan(job(replicas=2), parsed(RUNNING), obs, NOW))
    assert out["progress"]["step"] == 41 and "checkpointStep" not in out["progress"]


def test_a_script_that_reports_nothing_has_no_progress() -> None:
    obs = observed(worker(0), worker(1), reports={W0: report(), W1: report()})
    status = written(plan(job(replicas=2), parsed(RUNNING), obs, NOW))
    assert "progress" not in status


@pytest.mark.parametrize(
    ("written_ago", "other_change", "shows"),
    [
        pytest.param(2, False, 10, id="progress-only-within-the-interval-waits"),
        pytest.param(5, False, 20, id="progress-only-after-the-interval-is-written"),
        pytest.param(2, True, 20, id="with-another-change-written-at-once"),
    ],
)
def test_progress_writes_are_bounded(written_ago: float, other_change: bool, shows: int) -> None:
    s = Settings(progress_write_s=5)
    reports = {W0: report(progress=_progress(10)), W1: report(progress=_progress(10))}
    obs = observed(worker(0), worker(1), reports=reports)
    then = NOW - dt.timedelta(seconds=written_ago)
    before = decided(plan(job(replicas=2), parsed(RUNNING), obs, then, s))
    moved = {W0: report(progress=_progress(20)), W1: report(progress=_progress(20))}
    pods = (worker(0), worker(1), worker(2, "Pending")) if other_change else (worker(0), worker(1))
    result = plan(
        job(replicas=3 if other_change else 2), before, observed(*pods, reports=moved), NOW, s
    )
    progress = decided(result).progress
    assert progress is not None and progress.step == shows
    if shows == 10:
        assert decided(result) == before  # nothing to write
        assert result.requeue_after == pytest.approx(5 - written_ago)


def test_progress_stays_when_the_pods_that_reported_it_are_gone() -> None:
    prior = JobStatus(progress=TrainingProgress(step=99, last_update_time=NOW))
    result = plan(job(replicas=2), prior, observed(worker(0), worker(1)), NOW)
    assert decided(result).progress == prior.progress
