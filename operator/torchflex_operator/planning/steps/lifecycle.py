"""A job's lifecycle steps: suspend, resume, and the clean-up after it finished.

Where it sits: pure steps of the planner's pass (``planner._Pass``), called
from its ``decide`` like the steps in ``verdicts`` and ``training``: each
reads the pass and replaces its status or adds to its plan. Finishing the
job (phase, conditions, the Event) stays on the pass, which every verdict
calls.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from torchflex_operator.model.kueue import Admission, Gate, hold_message
from torchflex_operator.model.spec import CleanPodPolicy
from torchflex_operator.model.vocabulary import ConditionType, EventReason, EventType, Phase, Reason

if TYPE_CHECKING:
    from torchflex_operator.planning.pipeline import _Pass


def cleanup(p: _Pass) -> None:
    """Stop pods of a finished job per ``cleanPodPolicy``; then TTL."""
    policy = p.job.clean_pod_policy
    for pod in p.obs.pods:
        if pod.terminating or policy is CleanPodPolicy.NONE:
            continue
        if policy is CleanPodPolicy.ALL or not pod.finished:
            p.plan.delete(pod)
    ttl = p.job.ttl_seconds_after_finished
    done = p.s.completion_time
    if ttl is not None and done is not None:
        left = ttl - (p.now - done).total_seconds()
        if left <= 0:
            p.plan.delete_job = True
            p.plan.event(
                EventType.NORMAL,
                EventReason.TTL_EXPIRED,
                f"deleting job {ttl}s after it finished",
            )
        else:
            p.plan.wake_in(left)


def suspend(
    p: _Pass,
    reason: Reason = Reason.SUSPENDED_BY_USER,
    message: str = "spec.suspend is true",
    event: EventReason = EventReason.SUSPENDED,
) -> None:
    """``spec.suspend`` (or Kueue holding the job, ``hold``): delete every pod
    gracefully (SIGTERM; the agents leave the checkpoint as it is), keep the status."""
    pods = [pod for pod in p.obs.pods if not pod.terminating]
    for pod in pods:
        p.plan.delete(pod)
    current = p.condition(ConditionType.SUSPENDED)
    if p.prior_phase is not Phase.SUSPENDED or (
        current is not None and current.reason != reason.value
    ):
        p.plan.event(
            # Only an eviction is a warning: waiting for admission is a queue's normal state.
            EventType.WARNING if event is EventReason.EVICTED_BY_KUEUE else EventType.NORMAL,
            event,
            f"{message}; deleting {len(pods)} pod(s)" if pods else message,
        )
    p.s = replace(
        p.s,
        phase=Phase.SUSPENDED,
        start_time=None,
        below_min_since=None,
        backoff_until=None,
    )
    p.set_condition(ConditionType.SUSPENDED, status=True, reason=reason, message=message)


def hold(p: _Pass, gate: Gate) -> None:
    """Kueue holds a queued job: suspended while its Workload waits for admission,
    and suspended gracefully when Kueue evicts or preempts it (``queueing``)."""
    evicted = gate.admission is Admission.EVICTED
    suspend(
        p,
        Reason.EVICTED_BY_KUEUE if evicted else Reason.WAITING_FOR_ADMISSION,
        hold_message(gate),
        EventReason.EVICTED_BY_KUEUE if evicted else EventReason.WAITING_FOR_ADMISSION,
    )


def why_suspended(p: _Pass) -> tuple[Reason, str]:
    """The reason and message of a suspended job's idle conditions."""
    gate = p.obs.queue
    if not p.job.suspend and gate is not None and gate.holds:
        evicted = gate.admission is Admission.EVICTED
        reason = Reason.EVICTED_BY_KUEUE if evicted else Reason.WAITING_FOR_ADMISSION
        return reason, hold_message(gate)
    return Reason.SUSPENDED_BY_USER, "spec.suspend is true"


def resume(p: _Pass) -> None:
    """A live job: leave Suspended if it was, and start the clock once."""
    gate = p.obs.queue
    if p.prior_phase is Phase.SUSPENDED:
        if gate is None:
            p.plan.event(EventType.NORMAL, EventReason.RESUMED, "job resumed")
            message = "spec.suspend is false"
        else:
            message = f"Kueue admitted Workload {gate.workload} at {gate.count} worker(s)"
            p.plan.event(EventType.NORMAL, EventReason.ADMITTED, message)
        p.set_condition(
            ConditionType.SUSPENDED,
            status=False,
            reason=Reason.RESUMED,
            message=message,
        )
        p.s = replace(p.s, phase=Phase.PENDING)
    if p.s.start_time is None:
        p.s = replace(p.s, start_time=p.stamp)
