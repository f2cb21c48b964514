"""Workers their agents ended because they would not exit, as the job's status shows them.

Where it sits: a rule the planner's steps consult (``steps.failed.hung`` calls
``record`` each live pass; ``steps.outcome`` asks ``completion_reason`` and
``succeeded_note``). An agent that ended a worker hung at the end of the job
(``torchflex_agent.workers.hangs``: a teardown hang after its script returned,
or a completion hang still in the script after another member finished) puts
a ``HangReport`` with the worker's stack in its final report. Each such pod is
listed once in ``status.hungWorkers`` (bounded, newest last) with one
``WorkerHung`` Event; ``completion_reason`` names a completion hang as the
reason a job failed, and ``succeeded_note`` says a job that succeeded had one
ended in teardown.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

from torchflex_contract.progress import AgentReport, HangKind
from torchflex_operator.model.observed import PodView
from torchflex_operator.model.status import HungWorker
from torchflex_operator.model.vocabulary import Reason

KEPT = 8
"""Entries ``status.hungWorkers`` keeps (the newest)."""


def _key(entry: HungWorker) -> tuple[str, int | None, int | None]:
    return entry.pod, entry.round, entry.rank


def record(
    workers: Sequence[PodView],
    reports: Mapping[str, AgentReport],
    known: tuple[HungWorker, ...] | None,
    now: dt.datetime,
) -> tuple[tuple[HungWorker, ...] | None, list[HungWorker]]:
    """(the new ``hungWorkers``, the entries that are new this pass: one Event each)."""
    entries = list(known or ())
    seen = {_key(e) for e in entries}
    fresh: list[HungWorker] = []
    for pod in workers:
        if pod.phase not in ("Succeeded", "Failed"):
            continue  # a running agent's polled report: its final one will say
        report = reports.get(pod.name)
        hang = None if report is None else report.hang
        if hang is None:
            continue
        entry = HungWorker(
            pod=pod.name,
            rank=hang.rank,
            kind=hang.kind.value,
            seconds=round(hang.seconds, 1),
            round=hang.round,
            stack=hang.stack,
            time=now,
        )
        if _key(entry) in seen:
            continue
        seen.add(_key(entry))
        fresh.append(entry)
    if not fresh:
        return known, []
    return tuple([*entries, *fresh][-KEPT:]), fresh


def event_message(entry: HungWorker) -> str:
    """The ``WorkerHung`` Event's text for one entry."""
    what = (
        "hung in teardown after its script returned (its work was done)"
        if entry.kind == HangKind.TEARDOWN.value
        else "was still in the script after another member finished the job"
    )
    return (
        f"pod {entry.pod}: rank {entry.rank} {what}; its agent ended it after "
        f"{entry.seconds or 0:.0f} s; its stack is in status.hungWorkers"
    )


def completion_reason(
    known: tuple[HungWorker, ...] | None, final_round: int | None
) -> tuple[Reason, str]:
    """Why an incomplete final round failed the job: a completion hang, if one was seen."""
    for entry in reversed(known or ()):
        if entry.kind == HangKind.COMPLETION.value and (
            final_round is None or entry.round == final_round
        ):
            return Reason.COMPLETION_HANG, (
                f"pod {entry.pod}: rank {entry.rank} was still running "
                f"{entry.seconds or 0:.0f} s after another member finished the job "
                "(the agent's completion grace) and was ended; its stack is in "
                "status.hungWorkers"
            )
    return Reason.FINAL_ROUND_INCOMPLETE, ""


def succeeded_note(known: tuple[HungWorker, ...] | None, final_round: int | None) -> str:
    """A note for a succeeded job's message when members of its final round hung at exit."""
    pods = sorted({e.pod for e in known or () if final_round is None or e.round == final_round})
    if not pods:
        return ""
    return (
        f"; {len(pods)} member(s) hung in teardown and were ended by their agents "
        f"({', '.join(pods)}; stacks in status.hungWorkers)"
    )
