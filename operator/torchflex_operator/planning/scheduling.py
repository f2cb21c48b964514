"""What a pass writes for the job's PodGroup and PodDisruptionBudget, pure.

Where it sits: beside the pipeline, asked by ``runtime.reconcile`` after ``plan``:
these two objects are written once per process (and again when ``minReplicas`` or
``warmSpares`` changes), so the decision needs what this process already wrote
(``Written``, kept in ``runtime.memory``), which the pass's inputs do not carry. The
manifests and their patches are ``render.podgroup`` and ``render.pdb``.
"""

from __future__ import annotations

import dataclasses

from torchflex_operator.model.plan import Manifest
from torchflex_operator.model.spec import JobSpec
from torchflex_operator.model.vocabulary import GangScheduling
from torchflex_operator.render import pdb, podgroup


@dataclasses.dataclass(frozen=True)
class Written:
    """What this process wrote for a job's PodGroup and budget."""

    gang: int | None = None
    """The gang ``minCount`` written to the PodGroup; None: none yet."""
    budget: int | None = None
    """The budget's ``minAvailable``; None: none written, or deleted."""
    budget_spares: bool = False
    """Whether that budget's selector leaves warm spares out."""
    budget_deleted: bool = False
    """The budget was deleted (the job finished)."""


@dataclasses.dataclass(frozen=True)
class Scheduling:
    """The writes of one pass; all None/False: nothing to send."""

    pod_group: Manifest | None = None
    budget: Manifest | None = None
    delete_budget: bool = False


def decide(job: JobSpec, mode: GangScheduling, finished: bool, written: Written) -> Scheduling:
    """A live job's PodGroup (where PodGroups are served) and budget, written when this
    process has not written them as the spec wants; a finished job's budget deleted once:
    no minimum to hold any more."""
    gang = mode is GangScheduling.ENABLED and not finished
    group = podgroup.pod_group(job) if gang and podgroup.needs_write(job, written.gang) else None
    if finished:
        return Scheduling(pod_group=group, delete_budget=not written.budget_deleted)
    if pdb.needs_write(job, written.budget, written.budget_spares):
        return Scheduling(pod_group=group, budget=pdb.pod_disruption_budget(job))
    return Scheduling(pod_group=group)
