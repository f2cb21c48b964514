"""The step that fences members the group declared lost.

Where it sits: a pure step ``(Ctx, Draft) -> Draft`` of the planner's pipeline; the
verdicts themselves come from the agents' reports (``rules.fencing``), and each lost
member is counted once in the ledger (``planning.ledger``).
"""

from __future__ import annotations

from dataclasses import replace

from torchflex_operator.model.status import LastFailure, LostVerdict
from torchflex_operator.model.vocabulary import EventReason, EventType, Reason
from torchflex_operator.planning import ledger
from torchflex_operator.planning.context import Ctx, Draft
from torchflex_operator.planning.rules import fencing


def fence(ctx: Ctx, d: Draft) -> Draft:
    """Delete, with a short grace, pods whose member the group declared lost.

    Not forced: a forced delete frees the name before the kubelet has
    stopped anything, so a replacement could run beside the old process.
    With a short grace the kubelet's SIGKILL ends even a frozen process and
    the pod is gone within seconds; a pod on a lost node goes the
    force-delete path (``steps.failed.force_delete_stuck``).
    """
    settings = ctx.settings
    # When each verdict (pod, round) was first seen: it binds to the pod that existed then.
    known = {v.pod: v for v in d.status.lost_verdicts or ()}
    kept: list[LostVerdict] = []
    for name, (rnd, _) in sorted(fencing.verdicts(ctx.obs.reports).items()):
        entry = known.get(name)
        if entry is None or entry.round != rnd:
            entry = LostVerdict(name, rnd, ctx.stamp)
        kept.append(entry)
    d = d.with_status(lost_verdicts=tuple(kept[-settings.accounted_pods_kept :]) or None)
    first_seen = {v.pod: v.since for v in kept}
    for pod in d.members:
        # A fenced pod whose kubelet never confirms the deletion (the whole
        # machine froze or lost the network) is forced once its grace period
        # and the force-delete wait are over, as on a NotReady node, without
        # waiting for the node controller to notice (40 s and more).
        seen = first_seen.get(pod.name)
        if pod.deletion is None or seen is None or pod.created is None or pod.created >= seen:
            continue
        left = (pod.deletion - ctx.now).total_seconds() + settings.force_delete_after_s
        if left > 0:
            d = d.wake_in(left)
            continue
        d = d.delete(pod, force=True)
        d = d.event(
            EventType.WARNING,
            EventReason.FORCE_DELETED,
            f"force-deleted fenced pod {pod.name}: still terminating "
            f"{settings.force_delete_after_s:.0f}s after its grace period",
        )
    handled = set(ledger.accounted(d))
    new: list[str] = []
    obs = ctx.obs
    for lost in fencing.lost_members(
        d.members, obs.reports, obs.unanswered, first_seen, obs.rounds_seen
    ):
        pod = lost.pod
        d = d.delete(pod, grace_s=min(pod.grace_s, settings.fence_grace_s))
        if pod.uid in handled:
            continue
        handled.add(pod.uid)
        new.append(pod.uid)
        d = d.with_status(
            replacements=(d.status.replacements or 0) + 1,
            last_failure=LastFailure(
                pod=pod.name,
                reason=Reason.MEMBER_LOST.value,
                exit_code=None,
                counted=False,
                message=lost.message,
                time=ctx.stamp,
            ),
        )
        d = replace(d, replacements=(*d.replacements, Reason.MEMBER_LOST))
        d = d.event(
            EventType.WARNING,
            EventReason.FENCED_POD,
            f"{lost.message}: deleting it to replace it (not counted against backoffLimit)",
        )
    return ledger.account(ctx, d, new)
