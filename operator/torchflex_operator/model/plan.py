"""What one planning pass decides: the ``Plan`` value the reconciler applies.

Where it sits: ``planner.plan`` fills a ``Plan`` (pods and Services to
create, pods to delete and how, the job's new status, Events, when to look
again); ``reconciler`` applies it through ``kube``. A value with a few
helpers that keep it tidy (one delete per pod, the earliest wake-up), no
decisions of its own.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torchflex_operator.model.observed import PodView
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
    """Set a warm spare's ``torchflex.io/standby`` annotation to ``"false"`` (``spares``)."""

    name: str
    uid: str


@dataclasses.dataclass(frozen=True)
class Event:
    type: EventType
    reason: EventReason
    message: str


@dataclasses.dataclass
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

    def wake_in(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        if self.requeue_after is None or seconds < self.requeue_after:
            self.requeue_after = seconds

    def delete(self, pod: PodView, *, force: bool = False, grace_s: int | None = None) -> None:
        if all(d.name != pod.name for d in self.delete_pods):
            self.delete_pods.append(PodDelete(pod.name, pod.uid, force, grace_s))

    def event(self, etype: EventType, reason: EventReason, message: str) -> None:
        self.events.append(Event(etype, reason, message))
