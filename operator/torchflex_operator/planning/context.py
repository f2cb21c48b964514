"""What one planning pass reads (``Ctx``) and what it has decided so far (``Draft``).

Where it sits: under every step of ``planning.steps`` and above ``planning.rules``.
``Ctx`` holds the pass's frozen inputs: the job (capped at what Kueue admitted), the
status as the API holds it, what was observed, now, the settings. ``Draft`` holds the
frozen outputs so far: the status being decided, the actions planned, when to look
again, and the hand-offs between steps named as fields (``members`` and ``spares`` as
this pass has left them, the ``failed`` members accounting found, the completion
``verdict``, a ``fatal`` failure, creation ``held`` back by a refusal, the creation
``budget`` scaling used). A step reads both and returns a new ``Draft``
(``dataclasses.replace``); nothing here is mutated. ``Draft.to_plan`` turns the last
one into the ``Plan`` the runtime applies.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import replace
from typing import Any

from torchflex_contract import labels
from torchflex_operator.model.observed import Observed, PodView
from torchflex_operator.model.plan import Event, Manifest, Plan, PodDelete, PodPromote
from torchflex_operator.model.settings import Settings
from torchflex_operator.model.spec import JobSpec
from torchflex_operator.model.status import Condition, ConditionStatus, JobStatus
from torchflex_operator.model.vocabulary import (
    ConditionType,
    EventReason,
    EventType,
    Phase,
    Reason,
)
from torchflex_operator.planning.rules import conditions
from torchflex_operator.planning.rules.completion import Verdict
from torchflex_operator.planning.rules.pacing import Budget


@dataclasses.dataclass(frozen=True)
class Ctx:
    """The frozen inputs of one pass."""

    job: JobSpec
    """The job as planned: ``replicas`` capped at the count Kueue admitted, if queued."""
    prior: JobStatus
    """The status as the API holds it (the pass's starting point)."""
    obs: Observed
    now: dt.datetime
    settings: Settings
    role: str = labels.WORKER_ROLE
    """The worker group (training role) this pass plans: the job's one group, or one
    role of a multi-role job (``planning.pipeline`` plans each in turn)."""
    completes: bool = True
    """Whether this group's final round exiting 0 completes the job: false for a role
    of an Independent multi-role job other than ``spec.completionRole`` (under Joint
    coupling every role's pass judges the one joint round)."""

    @classmethod
    def of(
        cls,
        job: JobSpec,
        prior: JobStatus,
        observed: Observed,
        now: dt.datetime,
        settings: Settings,
    ) -> Ctx:
        gate = observed.queue
        if gate is not None and not gate.holds:
            # Kueue admitted this many workers (per role): the job runs at most at that size.
            job = job.admitted(gate.count, dict(gate.role_counts))
        return cls(job, prior, observed, now, settings)

    @property
    def stamp(self) -> dt.datetime:
        """``now`` as the status records it: whole seconds, like the string it becomes."""
        return self.now.replace(microsecond=0)

    @property
    def prior_phase(self) -> Phase | None:
        return self.prior.phase

    def since(self, when: dt.datetime | None) -> float | None:
        """Seconds from ``when`` to now; None for no time."""
        return None if when is None else (self.now - when).total_seconds()


@dataclasses.dataclass(frozen=True)
class Draft:
    """The frozen outputs of a pass so far; each step returns a new one."""

    status: JobStatus
    """The status being decided (a planned status always carries its conditions list)."""
    members: tuple[PodView, ...]
    """The worker group's members as this pass leaves them (warm spares promoted join)."""
    spares: tuple[PodView, ...]
    """Warm spares (``steps.spares``): never counted as members, in status or verdicts."""
    create_pods: tuple[Manifest, ...] = ()
    create_services: tuple[Manifest, ...] = ()
    create_network_policies: tuple[Manifest, ...] = ()
    delete_network_policies: tuple[str, ...] = ()
    delete_pods: tuple[PodDelete, ...] = ()
    promote_pods: tuple[PodPromote, ...] = ()
    events: tuple[Event, ...] = ()
    requeue_after: float | None = None
    delete_job: bool = False
    replacements: tuple[Reason, ...] = ()
    """Reason of each failed worker handled this pass (metrics)."""
    failed: tuple[PodView, ...] = ()
    """Members found failed by accounting, replaced later in the pass (``steps.failed``)."""
    fatal: str = ""
    """A failure retrying cannot help (a bad command): the job fails."""
    verdict: Verdict | None = None
    """The completion verdict (``rules.completion.judge``): None while nobody exited 0."""
    held: bool = False
    """A refused create waits (``steps.children.refusals``): nothing is created."""
    budget: Budget | None = None
    """The pass's creation budget, computed once (``steps.scaling.pace``)."""

    @classmethod
    def start(cls, ctx: Ctx) -> Draft:
        everyone = ctx.obs.workers(ctx.role)
        return cls(
            status=replace(ctx.prior, conditions=ctx.prior.conditions or ()),
            members=tuple(w for w in everyone if not w.standby),
            spares=tuple(w for w in everyone if w.standby),
        )

    # -- reading ---------------------------------------------------------------

    @property
    def finished(self) -> bool:
        return self.status.phase is not None and self.status.phase.finished

    @property
    def leaving(self) -> frozenset[str]:
        """Names of the pods this pass deletes."""
        return frozenset(d.name for d in self.delete_pods)

    @property
    def workers_created(self) -> int:
        """Worker pods (members and spares) this pass creates."""
        return sum(
            1
            for m in self.create_pods
            if m["metadata"]["labels"].get(labels.Label.ROLE) == labels.PodKind.WORKER
        )

    def condition(self, ctype: ConditionType) -> Condition | None:
        return conditions.get_condition(self.status.conditions or (), ctype)

    def turns(self, ctype: ConditionType, status: bool, message: str | None = None) -> bool:
        """Whether setting ``ctype`` to ``status`` (and ``message``) changes what status says."""
        cond = self.condition(ctype)
        want = ConditionStatus.TRUE if status else ConditionStatus.FALSE
        if cond is None or cond.status != want:
            return True
        return message is not None and cond.message != message

    # -- deciding --------------------------------------------------------------

    def with_status(self, **changes: Any) -> Draft:
        return replace(self, status=replace(self.status, **changes))

    def set_condition(
        self,
        ctx: Ctx,
        ctype: ConditionType,
        *,
        status: bool,
        reason: Reason,
        message: str,
    ) -> Draft:
        conds = conditions.set_condition(
            self.status.conditions or (),
            ctype,
            status=status,
            reason=reason,
            message=message,
            now=ctx.stamp,
            generation=ctx.job.generation,
        )
        return self.with_status(conditions=conds)

    def wake_in(self, seconds: float) -> Draft:
        seconds = max(0.0, seconds)
        if self.requeue_after is None or seconds < self.requeue_after:
            return replace(self, requeue_after=seconds)
        return self

    def delete(self, pod: PodView, *, force: bool = False, grace_s: int | None = None) -> Draft:
        if any(d.name == pod.name for d in self.delete_pods):
            return self
        return replace(
            self, delete_pods=(*self.delete_pods, PodDelete(pod.name, pod.uid, force, grace_s))
        )

    def event(self, etype: EventType, reason: EventReason, message: str) -> Draft:
        return replace(self, events=(*self.events, Event(etype, reason, message)))

    def create(self, *pods: Manifest) -> Draft:
        return replace(self, create_pods=(*self.create_pods, *pods))

    def to_plan(self) -> Plan:
        return Plan(
            create_pods=list(self.create_pods),
            create_services=list(self.create_services),
            create_network_policies=list(self.create_network_policies),
            delete_network_policies=list(self.delete_network_policies),
            delete_pods=list(self.delete_pods),
            promote_pods=list(self.promote_pods),
            status=self.status,
            events=list(self.events),
            requeue_after=self.requeue_after,
            delete_job=self.delete_job,
            replacements=list(self.replacements),
        )


def completion_group(ctx: Ctx, d: Draft) -> set[str]:
    """Names of the members whose round, world size and progress are the job's: all of
    a job of one group or of a Joint job (one group across its roles); the completion
    role's of an Independent multi-role job (its roles count rounds and steps of their
    own)."""
    role = ctx.job.completion_role_name
    every = not ctx.job.multi_role or ctx.job.joint
    return {w.name for w in d.members if every or w.group == role}


def group_members(ctx: Ctx, d: Draft) -> tuple[PodView, ...]:
    """The members of the rendezvous group this pass's role trains in: the role's own
    (``d.members``), except under Joint coupling, where one group holds every role's
    members (the other roles' as observed; this role's as the pass left them)."""
    if not ctx.job.joint:
        return d.members
    others = (
        w
        for r in ctx.job.roles
        if r.name != ctx.role
        for w in ctx.obs.workers(r.name)
        if not w.standby
    )
    return (*d.members, *others)


def finish(ctx: Ctx, d: Draft, phase: Phase, reason: Reason, message: str) -> Draft:
    """End the job: its phase, completion time, conditions and the Event that says so."""
    d = d.with_status(
        phase=phase,
        completion_time=ctx.stamp,
        below_min_since=None,
        backoff_until=None,
    )
    ctype = ConditionType.SUCCEEDED if phase is Phase.SUCCEEDED else ConditionType.FAILED
    d = d.set_condition(ctx, ctype, status=True, reason=reason, message=message)
    if phase is Phase.SUCCEEDED:  # batch/v1's word for it (docs/api.md, Conditions)
        d = d.set_condition(
            ctx, ConditionType.COMPLETE, status=True, reason=reason, message=message
        )
    etype = EventType.NORMAL if phase is Phase.SUCCEEDED else EventType.WARNING
    ereason = EventReason.SUCCEEDED if phase is Phase.SUCCEEDED else EventReason.FAILED
    return d.event(etype, ereason, f"{reason.value}: {message}")
