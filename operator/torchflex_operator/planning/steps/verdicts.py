"""Planner steps that act on verdicts from outside the pods' phases.

Where it sits: called by ``planner.plan`` on its pass state (``_Pass``),
pure like the rest of the planner. Each step turns one kind of evidence into
decisions, conditions and Events:

* ``force_delete_stuck``: node health, for pods stuck terminating;
* ``complete``: the completion verdict (``completion.judge``) while the job
  waits for the rest of its final round;
* ``fence``: members the group declared lost (``fencing.lost_members``);
* ``store_liveness``: agents blind to the rendezvous store;
* ``refusals``: the API server refused to create a child object;
* ``desired_size``: why the job is not at its desired size.

Conditions are level-derived: each pass recomputes them from what it
observes, and an Event is planned only where a condition turns (so a pass
that changes nothing plans nothing). Each step reads the pass's typed
status (``p.s``, a ``JobStatus``) and replaces it with what it decided.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from torchflex_contract.labels import Role
from torchflex_operator.model.observed import PodView
from torchflex_operator.model.status import ConditionStatus, LastFailure, LostVerdict, SilentMember
from torchflex_operator.model.timestamps import format_time
from torchflex_operator.model.vocabulary import ConditionType, EventReason, EventType, Phase, Reason
from torchflex_operator.planning.rules import fencing
from torchflex_operator.planning.rules.completion import Verdict
from torchflex_operator.planning.rules.pacing import Budget

if TYPE_CHECKING:
    from torchflex_operator.planning.pipeline import _Pass


def _turns(p: _Pass, ctype: ConditionType, status: bool, message: str | None = None) -> bool:
    """Whether setting ``ctype`` to ``status`` (and ``message``) changes what status says."""
    cond = p.condition(ctype)
    if cond is None or cond.status != (ConditionStatus.TRUE if status else ConditionStatus.FALSE):
        return True
    return message is not None and cond.message != message


def complete(p: _Pass, verdict: Verdict) -> None:
    """Some member exited 0, others may still work: stop nothing that may be one.

    No pod is created, replaced or rolled (a new member cannot join a job
    that is closed); pods that never reached a node cannot be members of
    the final round and are deleted. A pod awaited whose agent has not
    answered ``GET /status`` for ``completion_silence_s`` (frozen, cut off:
    its peers have exited, so no verdict of theirs will come) is fenced, so
    the job ends (``FinalRoundIncomplete``) instead of waiting forever.
    """
    if p.s.completing_since is None:
        p.s = replace(p.s, completing_since=p.stamp)
        p.plan.event(EventType.NORMAL, EventReason.COMPLETING, verdict.message)
    for pod in p.workers:
        if pod.active and not pod.node_name:
            p.plan.delete(pod)
    known = {e.pod: e for e in p.s.silent_members or ()}
    silent: list[SilentMember] = []
    for pod in p.workers:
        if pod.name not in verdict.waiting_for or pod.name not in p.obs.unanswered:
            continue
        entry = known.get(pod.name) or SilentMember(pod.name, p.stamp)
        silent.append(entry)
        left = p.settings.completion_silence_s - (p.now - entry.since).total_seconds()
        if left > 0:
            p.plan.wake_in(left)
            continue
        p.plan.delete(pod, grace_s=min(pod.grace_s, p.settings.fence_grace_s))
        p.plan.event(
            EventType.WARNING,
            EventReason.FENCED_POD,
            f"pod {pod.name} may be a member of the final round but its agent has not "
            f"answered /status since {format_time(entry.since)}: deleting it; the job cannot "
            "complete",
        )
    p.s = replace(p.s, silent_members=tuple(silent) or None)
    p.set_condition(
        ConditionType.AT_DESIRED_SIZE,
        status=False,
        reason=Reason.COMPLETING,
        message=verdict.message,
    )


def force_delete_stuck(p: _Pass) -> None:
    """Force pods stuck terminating on a lost node once grace + the wait are over."""
    for pod in p.obs.pods:
        if pod.deletion is None or not p.obs.node_lost(pod):
            continue
        left = (pod.deletion - p.now).total_seconds() + p.settings.force_delete_after_s
        if left <= 0:
            p.plan.delete(pod, force=True)
            p.plan.event(
                EventType.WARNING,
                EventReason.FORCE_DELETED,
                f"force-deleted pod {pod.name} stuck terminating on lost node {pod.node_name}",
            )
        else:
            p.plan.wake_in(left)


def fence(p: _Pass) -> None:
    """Delete, with a short grace, pods whose member the group declared lost.

    Not forced: a forced delete frees the name before the kubelet has
    stopped anything, so a replacement could run beside the old process.
    With a short grace the kubelet's SIGKILL ends even a frozen process and
    the pod is gone within seconds; a pod on a lost node goes the
    force-delete path (``force_delete_stuck``).
    """
    # When each verdict (pod, round) was first seen: it binds to the pod that existed then.
    known = {v.pod: v for v in p.s.lost_verdicts or ()}
    kept: list[LostVerdict] = []
    for name, (rnd, _) in sorted(fencing.verdicts(p.obs.reports).items()):
        entry = known.get(name)
        if entry is None or entry.round != rnd:
            entry = LostVerdict(name, rnd, p.stamp)
        kept.append(entry)
    p.s = replace(p.s, lost_verdicts=tuple(kept[-p.settings.accounted_pods_kept :]) or None)
    first_seen = {v.pod: v.since for v in kept}
    for pod in p.workers:
        # A fenced pod whose kubelet never confirms the deletion (the whole
        # machine froze or lost the network) is forced once its grace period
        # and the force-delete wait are over, as on a NotReady node, without
        # waiting for the node controller to notice (40 s and more).
        seen = first_seen.get(pod.name)
        if pod.deletion is None or seen is None or pod.created is None or pod.created >= seen:
            continue
        left = (pod.deletion - p.now).total_seconds() + p.settings.force_delete_after_s
        if left > 0:
            p.plan.wake_in(left)
            continue
        p.plan.delete(pod, force=True)
        p.plan.event(
            EventType.WARNING,
            EventReason.FORCE_DELETED,
            f"force-deleted fenced pod {pod.name}: still terminating "
            f"{p.settings.force_delete_after_s:.0f}s after its grace period",
        )
    accounted = list(p.s.accounted_pods or ())
    for lost in fencing.lost_members(
        p.workers, p.obs.reports, p.obs.unanswered, first_seen, p.obs.rounds_seen
    ):
        pod = lost.pod
        p.plan.delete(pod, grace_s=min(pod.grace_s, p.settings.fence_grace_s))
        if pod.uid in accounted:
            continue
        accounted.append(pod.uid)
        p.s = replace(
            p.s,
            replacements=(p.s.replacements or 0) + 1,
            last_failure=LastFailure(
                pod=pod.name,
                reason=Reason.MEMBER_LOST.value,
                exit_code=None,
                counted=False,
                message=lost.message,
                time=p.stamp,
            ),
        )
        p.plan.replacements.append(Reason.MEMBER_LOST)
        p.plan.event(
            EventType.WARNING,
            EventReason.FENCED_POD,
            f"{lost.message}: deleting it to replace it (not counted against backoffLimit)",
        )
    p.s = replace(p.s, accounted_pods=tuple(accounted[-p.settings.accounted_pods_kept :]))


def _host(p: _Pass) -> PodView | None:
    hosts = [*p.obs.role(Role.STORE), *p.obs.role(Role.ETCD)]
    return next((h for h in hosts if h.name == p.s.rendezvous_host), None)


def store_liveness(p: _Pass) -> None:
    health = fencing.store_health(p.workers, p.obs.reports)
    ctype = ConditionType.STORE_REACHABLE
    if not health.unreachable:
        running = sum(1 for w in p.workers if w.running)
        if 2 * health.reporting <= running:
            # Too few answers to clear it (agents stuck in a store call may not
            # answer; a replacement that has not tried the store says nothing).
            return
        if _turns(p, ctype, True):
            if p.condition(ctype) is not None:
                p.plan.event(
                    EventType.NORMAL, EventReason.STORE_REACHABLE, "agents reach the store again"
                )
            p.set_condition(
                ctype,
                status=True,
                reason=Reason.STORE_REACHABLE,
                message="no agent reports a store error",
            )
        p.s = replace(p.s, store_unreachable_since=None)
        return
    began = p.s.store_unreachable_since or p.stamp
    p.s = replace(p.s, store_unreachable_since=began)
    since = p.since(began) or 0.0
    message = f"{health.message}; since {format_time(began)}"
    if _turns(p, ctype, False):
        p.plan.event(EventType.WARNING, EventReason.STORE_UNREACHABLE, message)
    p.set_condition(ctype, status=False, reason=Reason.STORE_UNREACHABLE, message=message)
    host = _host(p)
    if not health.majority_blind or host is None or not host.running:
        return
    bound = p.settings.store_replace_after_s
    host_age = (p.now - host.created).total_seconds() if host.created else bound
    left = bound - min(since, host_age)
    if left > 0:
        p.plan.wake_in(left)
        return
    p.plan.delete(host, grace_s=min(host.grace_s, p.settings.fence_grace_s))
    p.plan.event(
        EventType.WARNING,
        EventReason.REPLACING_STORE,
        f"agents have been unable to reach the rendezvous store for {since:.0f}s "
        f"({health.message}) while pod {host.name} runs: replacing it",
    )


def refusals(p: _Pass) -> bool:
    """Condition and Events for refused creates; True while creation should wait.

    A 400/422 fails the job now: the same spec builds the same invalid
    object. A 403 from admission (Pod Security, quota) may clear by itself:
    creation is retried every ``refusal_retry_s`` and ``minAvailableTimeout``
    bounds the wait.
    """
    ctype = ConditionType.CHILDREN_ACCEPTED
    refused = sorted(p.obs.refusals.values(), key=lambda r: r.at)
    if not refused:
        if p.condition(ctype) is not None and _turns(p, ctype, True):
            p.set_condition(
                ctype,
                status=True,
                reason=Reason.ACCEPTED,
                message="every object was created",
            )
        return False
    last = refused[-1]
    message = f"the API server refused {last.kind} {last.name} (HTTP {last.code}): {last.message}"
    if _turns(p, ctype, False, message):
        p.plan.event(EventType.WARNING, EventReason.CREATE_REFUSED, message)
    p.set_condition(ctype, status=False, reason=Reason.CREATE_REFUSED, message=message)
    permanent = next((r for r in refused if r.permanent), None)
    if permanent is not None:
        p.finish(
            Phase.FAILED,
            Reason.CHILD_REJECTED,
            f"the API server rejected {permanent.kind} {permanent.name} "
            f"(HTTP {permanent.code}): {permanent.message}",
        )
        return True
    wait = p.settings.refusal_retry_s - (p.now - last.at).total_seconds()
    if wait > 0:
        p.plan.wake_in(wait)
        return True
    return False


def desired_size(p: _Pass, budget: Budget | None, held: bool) -> None:
    """``AtDesiredSize``: True when ``desiredReplicas`` workers run, else why not."""
    desired = p.job.desired if p.s.desired_replicas is None else p.s.desired_replicas
    running = sum(1 for w in p.workers if w.running)
    active = sum(1 for w in p.workers if w.active)
    have = f"{running} of {desired} desired workers running"
    until = p.s.backoff_until
    if running >= desired:
        status, reason, message = True, Reason.DESIRED_SIZE_RUNNING, have
    elif held:
        status, reason = False, Reason.CREATE_REFUSED
        message = f"{have}; pod creation refused (see ChildrenAccepted)"
    elif until is not None and until > p.now and active < desired:
        status, reason = False, Reason.BACKING_OFF
        message = f"{have}; replacements wait until {format_time(until)}"
    elif budget is not None and budget.capped and active < desired:
        status, reason = False, Reason.PENDING_CAP_REACHED
        message = (
            f"{have}; {budget.unscheduled} pod(s) wait for a node (at most "
            f"{p.settings.max_unscheduled}); {desired - active} more are created as they schedule"
        )
        shown = p.condition(ConditionType.AT_DESIRED_SIZE)
        if _turns(p, ConditionType.AT_DESIRED_SIZE, False) or (
            shown is None or shown.reason != reason.value
        ):
            p.plan.event(EventType.WARNING, EventReason.PENDING_CAP_REACHED, message)
    elif active < desired:
        status, reason = False, Reason.SCALING_UP
        message = f"{have}; {active} created, in growing batches as pods get a node"
    else:
        status, reason = False, Reason.STARTING
        message = f"{have}; {active - running} starting"
    p.set_condition(ConditionType.AT_DESIRED_SIZE, status=status, reason=reason, message=message)
