"""What the operator observed about one job's children, as plain data.

Where it sits: between the API and the planner. ``PodView.from_pod`` reduces
a Pod object (dict) to the few facts the plan needs; ``Observed`` bundles
one job's pods, Services, node health and agent reports at one instant.
Pure: no API, no clock.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any

from torchflex_contract import env, labels
from torchflex_contract.progress import AgentReport
from torchflex_operator.model.kueue import Gate
from torchflex_operator.model.timestamps import parse_time


@dataclasses.dataclass(frozen=True)
class PodView:
    name: str
    uid: str
    role: str
    """The ``torchflex.io/role`` label: the pod's kind (``PodKind``), not its training role."""
    index: int | None = None
    phase: str = "Pending"
    ready: bool = False
    node_name: str | None = None
    pod_ip: str | None = None
    created: dt.datetime | None = None
    deletion: dt.datetime | None = None
    grace_s: int = env.POD_GRACE_DEFAULT_S
    exit_code: int | None = None
    terminated_reason: str | None = None
    message: str = ""
    status_reason: str | None = None
    disruption_reason: str | None = None
    """Reason of a True ``DisruptionTarget`` condition, when present."""
    spec_hash: str | None = None
    """``torchflex.io/spec-hash``: the job spec the pod was built from."""
    standby: bool = False
    """``torchflex.io/standby`` is ``"true"``: a warm spare, not a member
    (``planning.steps.spares``)."""
    training_role: str | None = None
    """``torchflex.io/training-role``: the role of a multi-role job's worker pod."""

    @property
    def group(self) -> str | None:
        """The training role of a worker pod (its worker group); None for other kinds:
        its ``torchflex.io/training-role``, else the one group's ``labels.WORKER_ROLE``."""
        if self.role != labels.PodKind.WORKER:
            return None
        return self.training_role or labels.WORKER_ROLE

    @property
    def terminating(self) -> bool:
        return self.deletion is not None

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def active(self) -> bool:
        """Counts toward the desired replicas: not leaving, not ended."""
        return not self.terminating and not self.finished

    @property
    def running(self) -> bool:
        return self.active and self.phase == "Running"

    @classmethod
    def from_pod(cls, pod: Mapping[str, Any]) -> PodView:
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        pod_labels = meta.get("labels") or {}
        index: int | None = None
        raw_index = pod_labels.get(labels.Label.REPLICA_INDEX)
        if raw_index is not None:
            try:
                index = int(raw_index)
            except ValueError:
                index = None
        ready = False
        disruption: str | None = None
        for cond in status.get("conditions") or []:
            if cond.get("type") == "Ready" and cond.get("status") == "True":
                ready = True
            if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
                disruption = str(cond.get("reason") or "DisruptionTarget")
        exit_code: int | None = None
        term_reason: str | None = None
        message = ""
        statuses = status.get("containerStatuses") or []
        chosen = next(
            (cs for cs in statuses if cs.get("name") == labels.TRAINER_CONTAINER),
            statuses[0] if statuses else None,
        )
        term = ((chosen or {}).get("state") or {}).get("terminated")
        if term:
            exit_code = int(term.get("exitCode", 0))
            term_reason = term.get("reason")
            message = str(term.get("message") or "")
        grace = meta.get("deletionGracePeriodSeconds")
        if grace is None:
            grace = spec.get("terminationGracePeriodSeconds", env.POD_GRACE_DEFAULT_S)
        return cls(
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
            role=str(pod_labels.get(labels.Label.ROLE, "")),
            index=index,
            phase=str(status.get("phase") or "Pending"),
            ready=ready,
            node_name=spec.get("nodeName"),
            pod_ip=status.get("podIP"),
            created=parse_time(meta.get("creationTimestamp")),
            deletion=parse_time(meta.get("deletionTimestamp")),
            grace_s=int(grace if grace is not None else env.POD_GRACE_DEFAULT_S),
            exit_code=exit_code,
            terminated_reason=term_reason,
            message=message,
            status_reason=status.get("reason"),
            disruption_reason=disruption,
            spec_hash=(meta.get("annotations") or {}).get(labels.Annotation.SPEC_HASH),
            standby=(meta.get("annotations") or {}).get(labels.Annotation.STANDBY)
            == env.STANDBY_TRUE,
            training_role=pod_labels.get(labels.Label.TRAINING_ROLE) or None,
        )


@dataclasses.dataclass(frozen=True)
class Refusal:
    """The API server refused to create one of the job's objects (not RBAC)."""

    kind: str
    name: str
    code: int
    message: str
    """The server's own message (admission or validation), verbatim."""
    at: dt.datetime

    @property
    def permanent(self) -> bool:
        """400/422: the object built from this spec is invalid and stays so.

        403 from admission (Pod Security, quota) can go away by itself: a
        namespace label or a quota changes, other pods end.
        """
        return self.code in (400, 422)


@dataclasses.dataclass(frozen=True)
class Observed:
    """One job's world at one instant, as the planner sees it."""

    pods: tuple[PodView, ...] = ()
    services: frozenset[str] = frozenset()
    network_policies: frozenset[str] = frozenset()
    node_ready: Mapping[str, bool] = dataclasses.field(default_factory=dict)
    """Known nodes and whether they are Ready; a missing key means the node is gone."""
    nodes_known: bool = False
    """False when node health was not observed (then node loss is never assumed)."""
    reports: Mapping[str, AgentReport] = dataclasses.field(default_factory=dict)
    """Latest agent report per pod name (termination message or ``GET /status``)."""
    unanswered: frozenset[str] = frozenset()
    """Running pods whose agent was asked ``GET /status`` this pass and did not answer."""
    rounds_seen: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Per pod name, the newest rendezvous round this very pod (its UID, not a
    same-named predecessor) was ever seen reporting; absent: none seen."""
    refusals: Mapping[str, Refusal] = dataclasses.field(default_factory=dict)
    """Latest refused create per object name, until a create of that name succeeds."""
    posted_events: frozenset[int] = frozenset()
    """Ids of ``status.pendingEvents`` this operator has posted (see events.py)."""
    queue: Gate | None = None
    """What Kueue allows a queued job (``render.workload.gate``); None: the job is not queued."""

    def groups(self) -> dict[str, list[PodView]]:
        """Worker pods by training role (``PodView.group``), each group by index."""
        out: dict[str, list[PodView]] = {}
        for pod in sorted(self.pods, key=lambda p: (p.index or 0, p.name)):
            if pod.group is not None and pod.index is not None:
                out.setdefault(pod.group, []).append(pod)
        return out

    def workers(self, role: str = labels.WORKER_ROLE) -> list[PodView]:
        """The worker pods of one training role (the job's one group today), by index."""
        return self.groups().get(role, [])

    def of_kind(self, kind: labels.PodKind) -> list[PodView]:
        return [p for p in self.pods if p.role == kind]

    def node_lost(self, pod: PodView) -> bool:
        """The pod's node is gone or NotReady (only when nodes were observed)."""
        if not self.nodes_known or not pod.node_name:
            return False
        return not self.node_ready.get(pod.node_name, False)
