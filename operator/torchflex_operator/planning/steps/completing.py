"""The step of a completing job: some member exited 0, others may still work.

Where it sits: a pure step ``(Ctx, Draft) -> Draft`` of the planner's pipeline, run
instead of the live steps while ``Draft.verdict`` (``rules.completion.judge``) says the
job is completing and nothing ended it.
"""

from __future__ import annotations

from torchflex_operator.model.status import SilentMember
from torchflex_operator.model.timestamps import format_time
from torchflex_operator.model.vocabulary import ConditionType, EventReason, EventType, Reason
from torchflex_operator.planning.context import Ctx, Draft


def complete(ctx: Ctx, d: Draft) -> Draft:
    """Stop nothing that may be a member of the final round.

    No pod is created, replaced or rolled (a new member cannot join a job
    that is closed); pods that never reached a node cannot be members of
    the final round and are deleted. A pod awaited whose agent has not
    answered ``GET /status`` for ``completion_silence_s`` (frozen, cut off:
    its peers have exited, so no verdict of theirs will come) is fenced, so
    the job ends (``FinalRoundIncomplete``) instead of waiting forever.
    """
    verdict = d.verdict
    assert verdict is not None, "complete runs only for a completing job"
    if d.status.completing_since is None:
        d = d.with_status(completing_since=ctx.stamp)
        d = d.event(EventType.NORMAL, EventReason.COMPLETING, verdict.message)
    for pod in d.members:
        if pod.active and not pod.node_name:
            d = d.delete(pod)
    known = {e.pod: e for e in d.status.silent_members or ()}
    silent: list[SilentMember] = []
    for pod in d.members:
        if pod.name not in verdict.waiting_for or pod.name not in ctx.obs.unanswered:
            continue
        entry = known.get(pod.name) or SilentMember(pod.name, ctx.stamp)
        silent.append(entry)
        left = ctx.settings.completion_silence_s - (ctx.now - entry.since).total_seconds()
        if left > 0:
            d = d.wake_in(left)
            continue
        d = d.delete(pod, grace_s=min(pod.grace_s, ctx.settings.fence_grace_s))
        d = d.event(
            EventType.WARNING,
            EventReason.FENCED_POD,
            f"pod {pod.name} may be a member of the final round but its agent has not "
            f"answered /status since {format_time(entry.since)}: deleting it; the job cannot "
            "complete",
        )
    d = d.with_status(silent_members=tuple(silent) or None)
    return d.set_condition(
        ctx,
        ConditionType.AT_DESIRED_SIZE,
        status=False,
        reason=Reason.COMPLETING,
        message=verdict.message,
    )
