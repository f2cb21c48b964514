"""What this process remembers about each job between passes, and its one ``forget``.

Where it sits: owned by the ``Reconciler`` (``runtime.reconcile``). The watch's latest
job objects (``objects``), which jobs were read from the API since the process took
the lead (``synced``), and one ``JobRecord`` per job: the retry streak, refused
creates, Events posted, and what was written for the job's PodGroup and
PodDisruptionBudget. A job that goes away is forgotten by one call (``forget``),
however many facts are kept about it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torchflex_operator.model.observed import Refusal
from torchflex_operator.planning.scheduling import Written
from torchflex_operator.runtime.cache import JobKey


@dataclasses.dataclass
class JobRecord:
    """What this process remembers about one job (lost on restart: each is re-learnt)."""

    failures: int = 0
    """Passes in a row that raised a retryable error (the retry's back-off)."""
    refusals: dict[str, Refusal] = dataclasses.field(default_factory=dict)
    """Latest refused create per object name (cleared by a create that works)."""
    posted: set[int] = dataclasses.field(default_factory=set)
    """Ids of the job's ``status.pendingEvents`` posted by this process."""
    written: dict[str, Written] = dataclasses.field(default_factory=dict)
    """What this process wrote for the job's PodGroup and PodDisruptionBudget, per
    worker group (``JobSpec.role``: the one group of a job without ``spec.roles``)."""
    budget_refused: str = ""
    """The last reason the job's budget could not be written (said once in an Event)."""


class JobMemory:
    def __init__(self) -> None:
        self.objects: dict[JobKey, dict[str, Any]] = {}
        """Latest ElasticJob objects from the watch (or our own status writes)."""
        self.synced: set[JobKey] = set()
        """Jobs read from the API by this process since it took the lead."""
        self._records: dict[JobKey, JobRecord] = {}

    def record(self, key: JobKey) -> JobRecord:
        """The job's record, created on first use."""
        return self._records.setdefault(key, JobRecord())

    def peek(self, key: JobKey) -> JobRecord | None:
        """The job's record if this process keeps one (nothing is created)."""
        return self._records.get(key)

    def forget(self, key: JobKey) -> None:
        self.objects.pop(key, None)
        self.synced.discard(key)
        self._records.pop(key, None)
