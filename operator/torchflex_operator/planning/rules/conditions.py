"""Status conditions: set one, keeping ``lastTransitionTime`` stable.

Where it sits: used by the planner on the ``JobStatus.conditions`` it builds
(typed ``status.Condition`` values). A condition whose status did not change
keeps its old transition time, so a pass that changes nothing produces an
identical status and no write. A condition set carries the
``observedGeneration`` of the spec it was decided from, as
``metav1.Condition`` does (the planner stamps the ones it kept too).
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from torchflex_operator.model.status import Condition, ConditionStatus
from torchflex_operator.model.vocabulary import ConditionType, Reason


def set_condition(
    conditions: tuple[Condition, ...],
    ctype: ConditionType,
    *,
    status: bool,
    reason: Reason,
    message: str,
    now: dt.datetime,
    generation: int | None = None,
) -> tuple[Condition, ...]:
    """``conditions`` with ``ctype`` set (in place, or appended when new)."""
    value = ConditionStatus.TRUE if status else ConditionStatus.FALSE
    for i, cond in enumerate(conditions):
        if cond.is_type(ctype):
            when = now if cond.status != value else cond.last_transition_time
            new = dataclasses.replace(
                cond,
                status=value,
                reason=reason.value,
                message=message,
                last_transition_time=when,
                observed_generation=generation,
            )
            return (*conditions[:i], new, *conditions[i + 1 :])
    return (*conditions, Condition(ctype.value, value, reason.value, message, now, generation))


def get_condition(conditions: tuple[Condition, ...], ctype: ConditionType) -> Condition | None:
    return next((c for c in conditions if c.is_type(ctype)), None)
