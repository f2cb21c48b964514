"""Steps on members that ended or are stuck: count each failure once, replace it,
force pods stuck terminating on a lost node.

Where it sits: pure steps ``(Ctx, Draft) -> Draft`` of the planner's pipeline.
``account`` records each failed member in the ledger (``planning.ledger``) and hands
them on in ``Draft.failed`` (and a hopeless failure in ``Draft.fatal``); ``replace``,
later in the pass, deletes them. ``hung`` lists members whose agents ended a worker
that would not exit (``rules.hung``: ``status.hungWorkers``, ``WorkerHung``); ``stall``
records a hang the agents declared (``rules.stalls``: ``lastFailure``, ``HangDetected``).
"""

from __future__ import annotations

from dataclasses import replace

from torchflex_contract.exit_codes import ExitCode
from torchflex_operator.model.status import LastFailure
from torchflex_operator.model.vocabulary import EventReason, EventType, Reason
from torchflex_operator.planning import ledger
from torchflex_operator.planning.context import Ctx, Draft
from torchflex_operator.planning.rules import hung as hung_rules
from torchflex_operator.planning.rules import stalls
from torchflex_operator.planning.rules.failures import classify, final_report, root_cause
from torchflex_operator.planning.rules.stragglers import avoid


def hung(ctx: Ctx, d: Draft) -> Draft:
    """List members whose agents ended a worker that would not exit; one Event each."""
    listed, fresh = hung_rules.record(d.members, ctx.obs.reports, d.status.hung_workers, ctx.stamp)
    if not fresh:
        return d
    d = d.with_status(hung_workers=listed)
    for entry in fresh:
        d = d.event(EventType.WARNING, EventReason.WORKER_HUNG, hung_rules.event_message(entry))
    return d


def stall(ctx: Ctx, d: Draft) -> Draft:
    """Record a hang the agents declared (``rules.stalls``) once: lastFailure, one Event."""
    found = stalls.fresh(ctx.obs.reports, d.status.last_hang_round)
    if found is None:
        return d
    failure = stalls.last_failure(found, ctx.stamp)
    d = d.with_status(last_failure=failure, last_hang_round=found.round)
    return d.event(EventType.WARNING, EventReason.HANG_DETECTED, stalls.message(found))


def account(ctx: Ctx, d: Draft) -> Draft:
    """Count each failed member once (by UID, remembered in status); hand them on."""
    failed = tuple(w for w in d.members if w.phase == "Failed")
    new = ledger.fresh(d, failed)
    fatal, fresh = "", 0
    for pod in new:
        failure = classify(pod, ctx.obs)
        if failure.reason is Reason.POD_DELETED or pod.exit_code == ExitCode.RENDEZVOUS_CLOSED:
            continue  # deleted on purpose (already reported), or found the job closed
        fresh += 1
        if failure.fatal:
            fatal = f"pod {pod.name}: {failure.message[-300:]}"
        if failure.reason is Reason.BAD_NODE and pod.node_name:
            avoided = avoid(d.status.avoided_nodes, pod.node_name)
            d = d.with_status(avoided_nodes=avoided)
        s = d.status
        shown = None if s.last_failure is None else s.last_failure.root_cause
        cause = root_cause(pod.name, final_report(pod.message), shown)
        message = failure.message
        if cause is not None and f"{cause.type}: {cause.message}" not in message:
            # The agent's message may predate root causes: name the exception anyway.
            message = f"{message}; {cause.type}: {cause.message}".lstrip("; ")
        d = d.with_status(
            replacements=(s.replacements or 0) + 1,
            failures=(s.failures or 0) + 1 if failure.counted else s.failures,
            last_failure=LastFailure(
                pod=pod.name,
                reason=failure.reason.value,
                exit_code=failure.exit_code,
                counted=failure.counted,
                message=message[-1024:],
                time=ctx.stamp,
                root_cause=cause,
            ),
        )
        d = replace(d, replacements=(*d.replacements, failure.reason))
        code = "" if failure.exit_code is None else f" (exit code {failure.exit_code})"
        counted = "counted" if failure.counted else "not counted"
        d = d.event(
            EventType.WARNING,
            failure.event_reason,
            f"pod {pod.name} ended: {failure.reason.value}{code}, {counted} "
            f"against backoffLimit; {failure.message[-200:]}".rstrip("; "),
        )
    d = ledger.account(ctx, d, (p.uid for p in new), live_only=True)
    d = replace(d, failed=failed, fatal=fatal)
    if fresh and not fatal:  # a fatal failure ends the job: nothing is replaced
        d = ledger.back_off(ctx, d)
    return d


def replace_failed(ctx: Ctx, d: Draft) -> Draft:
    """Delete the failed members ``account`` found, to replace them."""
    for pod in d.failed:
        if not pod.terminating:
            d = d.delete(pod)
            d = d.event(
                EventType.NORMAL,
                EventReason.REPLACED_POD,
                f"deleting failed pod {pod.name} to replace it",
            )
    return d


def force_delete_stuck(ctx: Ctx, d: Draft) -> Draft:
    """Force pods stuck terminating on a lost node once grace + the wait are over."""
    for pod in ctx.obs.pods:
        if pod.deletion is None or not ctx.obs.node_lost(pod):
            continue
        left = (pod.deletion - ctx.now).total_seconds() + ctx.settings.force_delete_after_s
        if left <= 0:
            d = d.delete(pod, force=True)
            d = d.event(
                EventType.WARNING,
                EventReason.FORCE_DELETED,
                f"force-deleted pod {pod.name} stuck terminating on lost node {pod.node_name}",
            )
        else:
            d = d.wake_in(left)
    return d
