"""A job's lifecycle steps: suspend, resume, Kueue's hold, idle, the clean-up once finished.

Where it sits: pure steps ``(Ctx, Draft) -> Draft`` of the planner's pipeline
(``planning.pipeline``), like every module of ``planning.steps``. Finishing the job
(phase, conditions, the Event) is ``planning.context.finish``, which every verdict
calls.
"""

from __future__ import annotations

from dataclasses import replace

from torchflex_operator.model.kueue import Admission, hold_message
from torchflex_operator.model.spec import CleanPodPolicy
from torchflex_operator.model.status import ConditionStatus
from torchflex_operator.model.vocabulary import (
    ConditionType,
    EventReason,
    EventType,
    Phase,
    Reason,
)
from torchflex_operator.planning.context import Ctx, Draft


def cleanup(ctx: Ctx, d: Draft) -> Draft:
    """Stop pods of a finished job per ``cleanPodPolicy``; then TTL."""
    policy = ctx.job.clean_pod_policy
    for pod in ctx.obs.pods:
        if pod.terminating or policy is CleanPodPolicy.NONE:
            continue
        if policy is CleanPodPolicy.ALL or not pod.finished:
            d = d.delete(pod)
    ttl = ctx.job.ttl_seconds_after_finished
    done = d.status.completion_time
    if ttl is not None and done is not None:
        left = ttl - (ctx.now - done).total_seconds()
        if left <= 0:
            d = replace(d, delete_job=True).event(
                EventType.NORMAL,
                EventReason.TTL_EXPIRED,
                f"deleting job {ttl}s after it finished",
            )
        else:
            d = d.wake_in(left)
    return d


def suspend(
    ctx: Ctx,
    d: Draft,
    reason: Reason = Reason.SUSPENDED_BY_USER,
    message: str = "spec.suspend is true",
    event: EventReason = EventReason.SUSPENDED,
) -> Draft:
    """``spec.suspend`` (or Kueue holding the job, ``hold``): delete every pod
    gracefully (SIGTERM; the agents leave the checkpoint as it is), keep the status."""
    pods = [pod for pod in ctx.obs.pods if not pod.terminating]
    for pod in pods:
        d = d.delete(pod)
    current = d.condition(ConditionType.SUSPENDED)
    if ctx.prior_phase is not Phase.SUSPENDED or (
        current is not None and current.reason != reason.value
    ):
        d = d.event(
            # Only an eviction is a warning: waiting for admission is a queue's normal state.
            EventType.WARNING if event is EventReason.EVICTED_BY_KUEUE else EventType.NORMAL,
            event,
            f"{message}; deleting {len(pods)} pod(s)" if pods else message,
        )
    d = d.with_status(
        phase=Phase.SUSPENDED,
        start_time=None,
        below_min_since=None,
        backoff_until=None,
    )
    return d.set_condition(
        ctx, ConditionType.SUSPENDED, status=True, reason=reason, message=message
    )


def hold(ctx: Ctx, d: Draft) -> Draft:
    """Kueue holds a queued job: suspended while its Workload waits for admission,
    and suspended gracefully when Kueue evicts or preempts it (``render.workload``)."""
    gate = ctx.obs.queue
    assert gate is not None, "hold runs only for a job Kueue holds"
    evicted = gate.admission is Admission.EVICTED
    return suspend(
        ctx,
        d,
        Reason.EVICTED_BY_KUEUE if evicted else Reason.WAITING_FOR_ADMISSION,
        hold_message(gate),
        EventReason.EVICTED_BY_KUEUE if evicted else EventReason.WAITING_FOR_ADMISSION,
    )


def _why_suspended(ctx: Ctx) -> tuple[Reason, str]:
    """The reason and message of a suspended job's idle conditions."""
    gate = ctx.obs.queue
    if not ctx.job.suspend and gate is not None and gate.holds:
        evicted = gate.admission is Admission.EVICTED
        reason = Reason.EVICTED_BY_KUEUE if evicted else Reason.WAITING_FOR_ADMISSION
        return reason, hold_message(gate)
    return Reason.SUSPENDED_BY_USER, "spec.suspend is true"


def resume(ctx: Ctx, d: Draft) -> Draft:
    """A live job: leave Suspended if it was, and start the clock once."""
    gate = ctx.obs.queue
    # Said once per pass: each role of a multi-role job runs this step from the held phase.
    said = any(e.reason in (EventReason.RESUMED, EventReason.ADMITTED) for e in d.events)
    if ctx.prior_phase is Phase.SUSPENDED:
        if gate is None:
            message = "spec.suspend is false"
            if not said:
                d = d.event(EventType.NORMAL, EventReason.RESUMED, "job resumed")
        else:
            message = f"Kueue admitted Workload {gate.workload} at {gate.count} worker(s)"
            if gate.role_counts:
                message += " (" + ", ".join(f"{n} {c}" for n, c in gate.role_counts) + ")"
            if not said:
                d = d.event(EventType.NORMAL, EventReason.ADMITTED, message)
        d = d.set_condition(
            ctx,
            ConditionType.SUSPENDED,
            status=False,
            reason=Reason.RESUMED,
            message=message,
        )
        d = d.with_status(phase=Phase.PENDING)
    if d.status.start_time is None:
        d = d.with_status(start_time=ctx.stamp)
    return d


def resync(ctx: Ctx, d: Draft) -> Draft:
    """A job that goes on is looked at again at least every ``resync_s``."""
    return d.wake_in(ctx.settings.resync_s)


def queue_poll(ctx: Ctx, d: Draft) -> Draft:
    """Kueue's word is re-read this often (``render.workload.must_read``)."""
    if ctx.obs.queue is not None and not d.finished and not ctx.job.suspend:
        return d.wake_in(ctx.settings.queue_poll_s)
    return d


def idle(ctx: Ctx, d: Draft) -> Draft:
    """Conditions of a job that runs nothing on purpose (finished or suspended):
    ``Training`` is False and a True ``MinAvailable`` / ``AtDesiredSize`` turns False
    (a False one keeps the reason it had, such as the ``BelowMinReplicas`` that timed
    the job out); a succeeded job also carries batch/v1's ``Complete``."""
    if d.finished:
        phase = d.status.phase.value.lower() if d.status.phase else ""
        reason, message = Reason.JOB_FINISHED, f"the job {phase}; nothing runs"
    elif d.status.phase is Phase.SUSPENDED:
        reason, message = _why_suspended(ctx)
    else:
        return d
    d = d.set_condition(ctx, ConditionType.TRAINING, status=False, reason=reason, message=message)
    for ctype in (ConditionType.MIN_AVAILABLE, ConditionType.AT_DESIRED_SIZE):
        cond = d.condition(ctype)
        if cond is not None and cond.status is ConditionStatus.TRUE:
            d = d.set_condition(ctx, ctype, status=False, reason=reason, message=message)
    succeeded = d.condition(ConditionType.SUCCEEDED)
    if succeeded is not None and d.condition(ConditionType.COMPLETE) is None:
        # A job an older operator finished: the same fact under batch/v1's name.
        done = replace(succeeded, type=ConditionType.COMPLETE.value)
        d = d.with_status(conditions=(*(d.status.conditions or ()), done))
    return d
