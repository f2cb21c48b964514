"""Kueue as the operator sees it: a job's Workload (``WorkloadView``) and what it allows
the job (``Gate``, ``Observed.queue``).

Where it sits: frozen values of the model. ``runtime.admission`` reads the Workload
(``WorkloadView.parse``), ``render.workload.gate`` says what it allows, and the planner
(``planning``) obeys: hold the job suspended while it waits, run it at the admitted
count, or stop it gracefully when Kueue evicts it.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Any

from torchflex_operator.model.vocabulary import KueueCondition

POD_SET = "workers"
"""The Workload's one pod set of a job of one group: the job's worker pods (a
multi-role job has one pod set per role, named after the role)."""

AskedSet = tuple[str, int | None, int | None]
"""One pod set of a Workload's spec: its name, ``count`` and ``minCount``."""
# Kueue's Workload condition types (apis/kueue/v1beta2/workload_types.go).
QUOTA_RESERVED = KueueCondition.QUOTA_RESERVED.value
ADMITTED = KueueCondition.ADMITTED.value
EVICTED = KueueCondition.EVICTED.value
REQUEUED = KueueCondition.REQUEUED.value
FINISHED = KueueCondition.FINISHED.value


def find_condition(conditions: Sequence[Mapping[str, Any]], ctype: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions if c.get("type") == ctype), None)


def _true(cond: Mapping[str, Any] | None) -> bool:
    return cond is not None and cond.get("status") == "True"


def _int(value: object) -> int | None:
    return value if isinstance(value, int) else None


@dataclasses.dataclass(frozen=True)
class WorkloadView:
    """The few facts of a Workload the decisions need."""

    name: str
    uid: str = ""
    resource_version: str = ""
    generation: int = 0
    admitted: bool = False
    quota_reserved: bool = False
    evicted: bool = False
    evicted_reason: str = ""
    finished: bool = False
    count: int | None = None
    """``status.admission.podSetAssignments[workers].count``: the admitted pods."""
    asked: tuple[int | None, int | None] = (None, None)
    """``spec.podSets[workers]``'s ``(count, minCount)``: what the Workload asks quota for."""
    asked_sets: tuple[AskedSet, ...] = ()
    """Every pod set of ``spec.podSets`` (a multi-role job's: one per role), in order."""
    counts: tuple[tuple[str, int], ...] = ()
    """Every pod set's admitted count (``status.admission.podSetAssignments``)."""
    message: str = ""
    """Kueue's word on it: the Evicted, else QuotaReserved condition's message."""
    conditions: tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> WorkloadView:
        meta = obj.get("metadata") or {}
        status = obj.get("status") or {}
        conds = tuple(c for c in status.get("conditions") or () if isinstance(c, Mapping))
        assignments = (status.get("admission") or {}).get("podSetAssignments") or ()
        count = next(
            (a.get("count") for a in assignments if a.get("name") == POD_SET),
            None,
        )
        counts = tuple(
            (str(a.get("name", "")), a["count"])
            for a in assignments
            if isinstance(a.get("count"), int)
        )
        sets = (obj.get("spec") or {}).get("podSets") or ()
        pod_set: Mapping[str, Any] = next((s for s in sets if s.get("name") == POD_SET), {})
        count_asked, min_asked = pod_set.get("count"), pod_set.get("minCount")
        evicted = find_condition(conds, EVICTED)
        reserved = find_condition(conds, QUOTA_RESERVED)
        said = evicted if _true(evicted) else reserved
        return cls(
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
            resource_version=str(meta.get("resourceVersion", "")),
            generation=int(meta.get("generation", 0)),
            admitted=_true(find_condition(conds, ADMITTED)),
            quota_reserved=_true(reserved),
            evicted=_true(evicted),
            evicted_reason=str((evicted or {}).get("reason", "")),
            finished=_true(find_condition(conds, FINISHED)),
            count=count if isinstance(count, int) else None,
            asked=(
                count_asked if isinstance(count_asked, int) else None,
                min_asked if isinstance(min_asked, int) else None,
            ),
            message=str((said or {}).get("message", "")),
            conditions=conds,
            asked_sets=tuple(
                (str(s.get("name", "")), _int(s.get("count")), _int(s.get("minCount")))
                for s in sets
            ),
            counts=counts,
        )


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
    """The admitted worker pods (a multi-role job's: every role's together)."""
    message: str = ""
    role_counts: tuple[tuple[str, int], ...] = ()
    """A multi-role job's admitted pods per role, in spec order (empty otherwise)."""

    @property
    def holds(self) -> bool:
        return self.admission is not Admission.ADMITTED


def hold_message(g: Gate) -> str:
    """The Suspended condition's message while Kueue holds the job."""
    if g.admission is Admission.EVICTED:
        return f"Kueue evicted Workload {g.workload}: {g.message}"
    return f"Workload {g.workload} waits for admission in LocalQueue {g.queue}: {g.message}"
