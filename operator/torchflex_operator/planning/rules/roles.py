"""How the roles of a multi-role job add up to the job: its phase, conditions, timer.

Where it sits: under ``planning.pipeline``, which plans each role of a multi-role job
(``spec.roles``) in turn as a job of one group (``JobSpec.role_view``) and then asks
these pure functions what the job says as a whole. A role that finishes the job (the
completion role's final round succeeded, or any role failed) ends the pass before
anything is merged; what is merged here is the roles of a job that goes on. The rule
is "the job is as well as its worst role": ``Running`` only when every role runs, a
condition ``True`` only when it is for every role.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence

from torchflex_operator.model.status import Condition, ConditionStatus
from torchflex_operator.model.vocabulary import ConditionType, Phase, Reason
from torchflex_operator.planning.rules.conditions import get_condition

MERGED: tuple[ConditionType, ...] = (
    ConditionType.TRAINING,
    ConditionType.MIN_AVAILABLE,
    ConditionType.AT_DESIRED_SIZE,
)
"""The conditions each role's plan decides for itself; the job's is their merge."""


KNOWN: frozenset[str] = frozenset(r.value for r in Reason)


@dataclasses.dataclass(frozen=True)
class RoleOutcome:
    """What one role's plan left in the job's phase, timer and ``MERGED`` conditions."""

    name: str
    phase: Phase | None
    below_min_since: dt.datetime | None
    conditions: tuple[Condition, ...]


@dataclasses.dataclass(frozen=True)
class Said:
    """One merged condition: its status, the reason word and the message."""

    status: bool
    reason: Reason
    message: str


def job_phase(outcomes: Sequence[RoleOutcome]) -> Phase | None:
    """``Restarting`` if a role restarts, else ``Pending`` if one waits for its minimum,
    else ``Running`` when every role runs (None: no role said anything)."""
    phases = [o.phase for o in outcomes if o.phase is not None]
    for phase in (Phase.RESTARTING, Phase.PENDING):
        if phase in phases:
            return phase
    return phases[0] if phases else None


def below_min_since(outcomes: Sequence[RoleOutcome]) -> dt.datetime | None:
    """Since when some role has been below its minimum: the earliest role's time."""
    times = [o.below_min_since for o in outcomes if o.below_min_since is not None]
    return min(times) if times else None


def job_condition(ctype: ConditionType, outcomes: Sequence[RoleOutcome]) -> Said | None:
    """The first role for which ``ctype`` is ``False`` says it for the job, its message
    prefixed with the role; else every role's ``True`` messages joined (None: no role
    has the condition). A condition whose reason is not one of this operator's words
    (kept from an older operator's status) is left out."""
    said = [
        (o.name, c)
        for o in outcomes
        if (c := get_condition(o.conditions, ctype)) is not None and c.reason in KNOWN
    ]
    for name, cond in said:
        if cond.status is not ConditionStatus.TRUE:
            return Said(False, Reason(cond.reason), f"role {name}: {cond.message}")
    if not said:
        return None
    message = "; ".join(f"role {name}: {cond.message}" for name, cond in said)
    return Said(True, Reason(said[0][1].reason), message)
