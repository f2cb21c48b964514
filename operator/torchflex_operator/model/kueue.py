"""What Kueue allows a queued job: the ``Gate`` the planner obeys (``Observed.queue``).

Where it sits: a frozen value of the model, read from the job's Workload by
``render.workload.gate`` and obeyed by the planner (``planning``): hold the job
suspended while it waits, run it at the admitted count, or stop it gracefully
when Kueue evicts it.
"""

from __future__ import annotations

import dataclasses
import enum


class Admission(enum.Enum):
    WAITING = "waiting"
    """No Workload yet, or not admitted: no pods."""
    ADMITTED = "admitted"
    """Runs at ``Gate.count`` worker pods."""
    EVICTED = "evicted"
    """Kueue took the admission back: stop gracefully, then release the quota."""


@dataclasses.dataclass(frozen=True)
class Gate:
    """What Kueue allows a queued job this pass (``Observed.queue``)."""

    admission: Admission
    workload: str
    queue: str
    count: int = 0
    message: str = ""

    @property
    def holds(self) -> bool:
        return self.admission is not Admission.ADMITTED


def hold_message(g: Gate) -> str:
    """The Suspended condition's message while Kueue holds the job."""
    if g.admission is Admission.EVICTED:
        return f"Kueue evicted Workload {g.workload}: {g.message}"
    return f"Workload {g.workload} waits for admission in LocalQueue {g.queue}: {g.message}"
