"""Events that survive the operator dying mid-pass: they travel in the status.

Where it sits: the planner calls ``carry`` at the end of a pass; the
reconciler posts what it returns. The Events a pass decides are written into
``status.pendingEvents`` (each with an id from ``status.eventSeq``) by the
same single status write that carries the decisions they describe, and only
then posted. The reconciler remembers the ids it posted; the next pass drops
those from the status. An operator that dies after the status write and
before posting (or a new leader taking over) finds them still pending and
posts them: at least once, never lost. A post the API refuses for good is
dropped like a posted one; the list is bounded (oldest dropped first).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

MAX_PENDING = 32


def carry(
    prior: Mapping[str, Any],
    new: Sequence[tuple[str, str, str]],
    posted: frozenset[int],
) -> tuple[list[dict[str, Any]], int]:
    """(pendingEvents, eventSeq) after a pass that decided ``new`` (type, reason, message)."""
    seq = int(prior.get("eventSeq", 0))
    pending = [
        dict(e)
        for e in prior.get("pendingEvents") or []
        if isinstance(e, Mapping) and int(e.get("id", -1)) not in posted
    ]
    for etype, reason, message in new:
        seq += 1
        pending.append({"id": seq, "type": etype, "reason": reason, "message": message[:1024]})
    return pending[-MAX_PENDING:], seq


def settle(
    status: dict[str, Any],
    prior: Mapping[str, Any],
    new: Sequence[tuple[str, str, str]],
    posted: frozenset[int],
) -> None:
    """Write ``pendingEvents`` and ``eventSeq`` of the pass's new ``status``."""
    pending, seq = carry(prior, new, posted)
    if pending:
        status["pendingEvents"] = pending
    else:
        status.pop("pendingEvents", None)
    if seq:
        status["eventSeq"] = seq


def due(status: Mapping[str, Any], posted: frozenset[int]) -> list[dict[str, Any]]:
    """Pending events of ``status`` not posted yet, oldest first."""
    return [
        dict(e)
        for e in status.get("pendingEvents") or []
        if isinstance(e, Mapping) and int(e.get("id", -1)) not in posted
    ]
