"""What one planning pass decides: the ``Plan`` value the runtime applies.

Where it sits: ``planning.plan`` returns a ``Plan`` (pods and Services to
create, pods to delete and how, the job's new status, Events, when to look
again); ``runtime.reconcile`` applies it through ``kube``. A frozen value built
once, at the end of the pass (``planning.context.Draft.to_plan``), with no
decisions of its own.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torchflex_operator.model.status import JobStatus
from torchflex_operator.model.vocabulary import EventReason, EventType, Reason

Manifest = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class PodDelete:
    name: str
    uid: str
    force: bool = False
    """Grace period 0: only for pods stuck terminating on a lost node."""
    grace_s: int | None = None
    """A shorter grace period than the pod's own (fencing a silent pod); None: the pod's."""


@dataclasses.dataclass(frozen=True)
class PodPromote:
    """Set a warm spare's ``torchflex.io/standby`` annotation to ``"false"``
    (``planning.steps.spares``)."""

    name: str
    uid: str


@dataclasses.dataclass(frozen=True)
class Event:
    type: EventType
    reason: EventReason
    message: str


@dataclasses.dataclass(frozen=True)
class Plan:
    create_pods: list[Manifest] = dataclasses.field(default_factory=list)
    create_services: list[Manifest] = dataclasses.field(default_factory=list)
    create_network_policies: list[Manifest] = dataclasses.field(default_factory=list)
    delete_network_policies: list[str] = dataclasses.field(default_factory=list)
    delete_pods: list[PodDelete] = dataclasses.field(default_factory=list)
    promote_pods: list[PodPromote] = dataclasses.field(default_factory=list)
    status: JobStatus | None = None
    """The job's new status; None: none decided (a job being deleted)."""
    events: list[Event] = dataclasses.field(default_factory=list)
    requeue_after: float | None = None
    delete_job: bool = False
    replacements: list[Reason] = dataclasses.field(default_factory=list)
    """Reason of each failed worker handled this pass (metrics)."""
