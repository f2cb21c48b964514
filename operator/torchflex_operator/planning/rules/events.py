"""Events that survive the operator dying mid-pass: they travel in the status.

Where it sits: the planner calls ``settle`` at the end of a pass (typed
``PendingEvent`` values in its ``JobStatus``); the reconciler posts what
``due`` returns. The Events a pass decides are written into
``status.pendingEvents`` (each with an id from ``status.eventSeq``) by the
same single status write that carries the decisions they describe, and only
then posted. The reconciler remembers the ids it posted; the next pass drops
those from the status. An operator that dies after the status write and
before posting (or a new leader taking over) finds them still pending and
posts them: at least once, never lost. A post the API refuses for good is
dropped like a posted one; the list is bounded (oldest dropped first).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from torchflex_operator.model.status import JobStatus, PendingEvent
from torchflex_operator.model.vocabulary import EventType

MAX_PENDING = 32


def carry(
    prior: JobStatus,
    new: Sequence[tuple[EventType, str, str]],
    posted: frozenset[int],
) -> tuple[tuple[PendingEvent, ...], int]:
    """(pendingEvents, eventSeq) after a pass that decided ``new`` (type, reason, message)."""
    seq = prior.event_seq or 0
    pending = due(prior, posted)
    for etype, reason, message in new:
        seq += 1
        pending.append(PendingEvent(seq, etype, reason, message[:1024]))
    return tuple(pending[-MAX_PENDING:]), seq


def settle(
    status: JobStatus,
    prior: JobStatus,
    new: Sequence[tuple[EventType, str, str]],
    posted: frozenset[int],
) -> JobStatus:
    """The pass's new ``status`` with its ``pendingEvents`` and ``eventSeq``."""
    pending, seq = carry(prior, new, posted)
    return dataclasses.replace(
        status, pending_events=pending or None, event_seq=seq or status.event_seq
    )


def due(status: JobStatus, posted: frozenset[int]) -> list[PendingEvent]:
    """Pending events of ``status`` not posted yet, oldest first."""
    return [e for e in status.pending_events or () if e.id not in posted]
