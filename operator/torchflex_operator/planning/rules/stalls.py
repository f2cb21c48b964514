"""Hangs the agents declared, as the job's status and Events show them.

Where it sits: a rule the planner's steps consult (``steps.failed.stall`` calls
``fresh`` and ``last_failure`` each live pass). When a job makes no training
progress anywhere for its hang timeout, every agent records its ranks' stacks
and restarts its workers; the agent that held node rank 0 assembles a
``StallReport`` (the rank that stopped first, then every rank) in its live
report (``GET /status``, read by the long poll when the round changes). Each
declared hang is recorded once, by its round (``status.lastHangRound``), as
``status.lastFailure`` (reason ``Hang``) with one ``HangDetected`` Event.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

from torchflex_contract.progress import AgentReport, StallReport
from torchflex_operator.model.status import LastFailure, RankStack
from torchflex_operator.model.vocabulary import Reason


def fresh(reports: Mapping[str, AgentReport], known_round: int | None) -> StallReport | None:
    """The newest hang any report carries that status does not record yet."""
    newest: StallReport | None = None
    for report in reports.values():
        stall = report.stall
        if stall is None or (known_round is not None and stall.round <= known_round):
            continue
        if newest is None or stall.round > newest.round:
            newest = stall
    return newest


def last_failure(stall: StallReport, now: dt.datetime) -> LastFailure:
    """``status.lastFailure`` for a declared hang (counted against maxRestarts by the
    agents, not against backoffLimit: no pod failed)."""
    return LastFailure(
        pod=stall.pod,
        reason=Reason.HANG.value,
        counted=False,
        message=message(stall),
        time=now,
        rank=stall.rank,
        round=stall.round,
        stacks=tuple(
            RankStack(
                rank=r.rank,
                pod=r.pod,
                steps=r.steps,
                idle_seconds=r.idle,
                waiting=r.waiting,
                stack=r.stack,
            )
            for r in stall.ranks
        ),
    )


def message(stall: StallReport) -> str:
    """The Event's and ``lastFailure.message``'s text."""
    return (
        f"{stall.summary()}; every rank's stack is in status.lastFailure.stacks; the "
        "workers were restarted (counted against maxRestarts)"
    )
