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

from torchflex_operator.spec import CleanPodPolicy
from torchflex_operator.vocabulary import ConditionType, EventReason, EventType, Phase, Reason

if TYPE_CHECKING:
    from torchflex_operator.planner import _Pass


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


def suspend(p: _Pass) -> None:
    """``spec.suspend``: delete every pod (Kueue's and the user's pause), keep the status."""
    pods = [pod for pod in p.obs.pods if not pod.terminating]
    for pod in pods:
        p.plan.delete(pod)
    if p.prior_phase is not Phase.SUSPENDED:
        p.plan.event(
            EventType.NORMAL,
            EventReason.SUSPENDED,
            f"job suspended; deleting {len(pods)} pod(s)",
        )
    p.s = replace(
        p.s,
        phase=Phase.SUSPENDED,
        start_time=None,
        below_min_since=None,
        backoff_until=None,
    )
    p.set_condition(
        ConditionType.SUSPENDED,
        status=True,
        reason=Reason.SUSPENDED_BY_USER,
        message="spec.suspend is true",
    )


def resume(p: _Pass) -> None:
    """A live job: leave Suspended if it was, and start the clock once."""
    if p.prior_phase is Phase.SUSPENDED:
        p.plan.event(EventType.NORMAL, EventReason.RESUMED, "job resumed")
        p.set_condition(
            ConditionType.SUSPENDED,
            status=False,
            reason=Reason.RESUMED,
            message="spec.suspend is false",
        )
        p.s = replace(p.s, phase=Phase.PENDING)
    if p.s.start_time is None:
        p.s = replace(p.s, start_time=p.stamp)
