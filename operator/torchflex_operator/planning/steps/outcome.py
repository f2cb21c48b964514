"""The step that decides whether a live job ends now, and how.

Where it sits: a pure step ``(Ctx, Draft) -> Draft`` of the planner's pipeline, after
failures are accounted (``steps.failed``). In order: the completion verdict
(``rules.completion.judge``: every member succeeded, or the final round cannot
complete; a member ended in a completion hang names the failure, ``rules.hung``), a
failure retrying cannot help (``Draft.fatal``), more counted failures than
``backoffLimit``, ``activeDeadlineSeconds``. The verdict is handed on in
``Draft.verdict``: a job whose members started to exit 0 is completing.
"""

from __future__ import annotations

from dataclasses import replace

from torchflex_operator.model.vocabulary import Phase, Reason
from torchflex_operator.planning.context import Ctx, Draft, finish, group_members
from torchflex_operator.planning.rules import completion, hung


def judge(ctx: Ctx, d: Draft) -> Draft:
    """End the job if a verdict says so; else wake at its deadline, if it has one."""
    job = ctx.job
    deadline = job.active_deadline_s
    started = ctx.since(d.status.start_time) or 0.0
    # Under Joint coupling the final round holds every role's members: judged whole.
    verdict = completion.judge(group_members(ctx, d), ctx.obs.reports)
    d = replace(d, verdict=verdict)
    outcome = None if verdict is None else verdict.outcome
    failures = d.status.failures or 0
    # A role that does not complete the job is left to finish its round (COMPLETING);
    # the job goes on until its completion role succeeds.
    if verdict is not None and outcome is completion.Outcome.SUCCEEDED and ctx.completes:
        note = hung.succeeded_note(d.status.hung_workers, None)
        message = verdict.message + note
        return finish(ctx, d, Phase.SUCCEEDED, Reason.WORKER_GROUP_SUCCEEDED, message)
    if verdict is not None and outcome is completion.Outcome.FAILED:
        reason, hang = hung.completion_reason(d.status.hung_workers, None)
        message = f"{verdict.message}; {hang}" if hang else verdict.message
        return finish(ctx, d, Phase.FAILED, reason, message)
    if d.fatal:
        return finish(ctx, d, Phase.FAILED, Reason.BAD_COMMAND, d.fatal)
    if failures > job.backoff_limit:
        last = d.status.last_failure
        pod, why, code, text = (
            (None, None, None, "")
            if last is None
            else (last.pod, last.reason, last.exit_code, last.message)
        )
        return finish(
            ctx,
            d,
            Phase.FAILED,
            Reason.BACKOFF_LIMIT_EXCEEDED,
            f"{failures} counted failures > backoffLimit={job.backoff_limit}; last: "
            f"{pod} {why} exit {code}: {text[-300:]}",
        )
    if deadline is not None and started >= deadline:
        return finish(
            ctx,
            d,
            Phase.FAILED,
            Reason.DEADLINE_EXCEEDED,
            f"running longer than activeDeadlineSeconds={deadline}",
        )
    if deadline is not None:
        d = d.wake_in(deadline - started)
    return d
