"""Status conditions: set one, keeping ``lastTransitionTime`` stable.

Where it sits: used by the planner on the status dict it builds. A condition
whose status did not change keeps its old transition time, so a pass that
changes nothing produces an identical status and no write.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from torchflex_operator.timestamps import format_time
from torchflex_operator.vocabulary import ConditionType, Reason


def set_condition(
    conditions: list[dict[str, Any]],
    ctype: ConditionType,
    *,
    status: bool,
    reason: Reason,
    message: str,
    now: dt.datetime,
) -> None:
    value = "True" if status else "False"
    for cond in conditions:
        if cond.get("type") == ctype:
            if cond.get("status") != value:
                cond["lastTransitionTime"] = format_time(now)
            cond.update(status=value, reason=reason.value, message=message)
            return
    conditions.append(
        {
            "type": ctype.value,
            "status": value,
            "reason": reason.value,
            "message": message,
            "lastTransitionTime": format_time(now),
        }
    )


def get_condition(conditions: list[dict[str, Any]], ctype: ConditionType) -> dict[str, Any] | None:
    return next((c for c in conditions if c.get("type") == ctype), None)
