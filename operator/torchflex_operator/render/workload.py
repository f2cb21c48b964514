"""Kueue admission of a queued job: its Workload, what admission allows, and the release.

Where it sits: pure, beside ``render.podgroup``. Kueue (``sigs.k8s.io/kueue``) runs
ElasticJob as an *external framework* (its config names
``ElasticJob.v1alpha1.torchflex.io`` under ``integrations.externalFrameworks``):
Kueue admits Workloads, and the framework's own controller (this operator)
writes each job's Workload and obeys it. A job labelled
``kueue.x-k8s.io/queue-name`` gets one Workload (``workload``): owned by the
job, named from it, one pod set of ``maxReplicas`` worker pods with
``minCount`` ``minReplicas`` (Kueue's partial admission may admit fewer, down to
the minimum), the worker pod template, and the priority of its
``kueue.x-k8s.io/priority-class`` WorkloadPriorityClass. A multi-role job asks one
pod set per role (``asked``, ``pod_sets``), and runs each role at its own admitted
count (``Gate.role_counts``, ``JobSpec.admitted``).

``gate`` reads the Workload and says what the planner does: hold the job
suspended (no pods) while it waits, run it at the admitted count, or suspend it
gracefully when Kueue evicts or preempts it (``planning.steps.lifecycle.suspend``: SIGTERM,
the checkpoint stays). ``workload_action`` says what the reconciler then
writes on the Workload, mirroring Kueue's own job controllers: once an evicted
job has no pod left, its quota reservation is released (``release_patch``:
``Requeued``, ``QuotaReserved=False``, no ``admission``) so Kueue can queue it
again; once the job has finished, ``Finished`` (``finished_patch``) frees the
quota. A job without the label is not gated at all (a cluster without Kueue
works as before).
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Mapping, Sequence
from typing import Any

from torchflex_contract.labels import PodKind
from torchflex_operator.model import kueue
from torchflex_operator.model.kueue import Admission, AskedSet, Gate, WorkloadView
from torchflex_operator.model.spec import JobSpec
from torchflex_operator.model.timestamps import format_time
from torchflex_operator.model.vocabulary import (
    KueueConditionReason,
    KueueEvictionReason,
    KueueLabel,
    Phase,
)
from torchflex_operator.render.manifests import Manifest, object_labels, owner_ref

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
API_VERSION = f"{GROUP}/{VERSION}"
PLURAL = "workloads"
KIND = "Workload"
PRIORITY_CLASSES = "workloadpriorityclasses"
POD_SET = kueue.POD_SET
# Kueue's Workload condition types (apis/kueue/v1beta2/workload_types.go).
QUOTA_RESERVED = kueue.QUOTA_RESERVED
ADMITTED = kueue.ADMITTED
EVICTED = kueue.EVICTED
REQUEUED = kueue.REQUEUED
FINISHED = kueue.FINISHED


def workload_name(job: JobSpec) -> str:
    """Deterministic: ``kubectl get workload elasticjob-<job>``."""
    return f"elasticjob-{job.name}"


def asked(job: JobSpec) -> tuple[AskedSet, ...]:
    """The pod sets the job's Workload asks quota for: ``(name, count, minCount)``. One
    of ``maxReplicas`` with ``minCount`` ``minReplicas``; a multi-role job's one per
    role, named after it, of the role's ``maxReplicas``, with a ``minCount`` only for
    its one elastic role (``JobSpec.parse`` refuses more: Kueue admits one)."""
    if not job.multi_role:
        return ((POD_SET, job.max_replicas, job.min_replicas),)
    return tuple((r.name, r.max_replicas, r.min_replicas if r.elastic else None) for r in job.roles)


def pod_sets(job: JobSpec) -> list[Manifest]:
    """The Workload's ``spec.podSets`` (``asked``), each with its pods' template."""
    templates = {POD_SET: job.template} | {r.name: r.template for r in job.roles}
    out: list[Manifest] = []
    for name, count, min_count in asked(job):
        pod_set: Manifest = {"name": name, "count": count}
        if min_count is not None:
            pod_set["minCount"] = min_count
        out.append(pod_set | {"template": dict(templates[name])})
    return out


def workload(job: JobSpec, priority: int | None) -> Manifest:
    """The job's Workload; ``priority`` is its WorkloadPriorityClass's value (None: none)."""
    spec: Manifest = {"queueName": job.queue_name or "", "podSets": pod_sets(job)}
    if job.priority_class is not None and priority is not None:
        spec["priorityClassRef"] = {
            "group": GROUP,
            "kind": "WorkloadPriorityClass",
            "name": job.priority_class,
        }
        spec["priority"] = priority
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": workload_name(job),
            "namespace": job.namespace,
            # Kueue names the job's UID in its messages (and its metrics) from this label.
            "labels": {**object_labels(job, PodKind.WORKER), KueueLabel.JOB_UID.value: job.uid},
            "ownerReferences": [owner_ref(job)],
        },
        "spec": spec,
    }


def stale(job: JobSpec, view: WorkloadView) -> bool:
    """Whether the Workload asks quota for other replicas than the job's (``minReplicas``
    or ``maxReplicas`` edited since it was created, a role added): it is replaced,
    never obeyed."""
    if not job.multi_role:
        return view.asked != (job.max_replicas, job.min_replicas)
    return view.asked_sets != asked(job)


def _role_counts(job: JobSpec, view: WorkloadView) -> tuple[tuple[str, int], ...] | str:
    """A multi-role job's admitted pods per role (a role Kueue gave no count is admitted
    whole); or why the admission cannot be run (a count outside the role's range)."""
    given = dict(view.counts)
    out: list[tuple[str, int]] = []
    for r in job.roles:
        count = given.get(r.name, r.max_replicas)
        if not r.min_replicas <= count <= r.max_replicas:
            return (
                f"Kueue admitted {count} pods of role {r.name}, outside "
                f"{r.min_replicas}-{r.max_replicas}"
            )
        out.append((r.name, count))
    return tuple(out)


def gate(job: JobSpec, view: WorkloadView | None) -> Gate | None:
    """None for a job that is not queued; else what its Workload allows."""
    if job.queue_name is None:
        return None
    name, queue = workload_name(job), job.queue_name
    if view is None:
        return Gate(Admission.WAITING, name, queue, message="its Workload is being created")
    if view.evicted and view.quota_reserved:  # its quota is given back once no pod is left
        return Gate(Admission.EVICTED, name, queue, message=view.message or "evicted")
    if stale(job, view):
        # Running on the old admission would use quota Kueue never granted (a raised
        # minimum) or hold quota the job cannot use: stop, then ask again.
        return Gate(
            Admission.WAITING,
            name,
            queue,
            message=f"its Workload asked for {_asked_text(view)} pods and the job now runs "
            f"{_job_text(job)}: it is replaced once no pod is left",
        )
    if not view.admitted:
        return Gate(Admission.WAITING, name, queue, message=view.message or "not admitted yet")
    if job.multi_role:
        counts = _role_counts(job, view)
        if isinstance(counts, str):
            return Gate(Admission.WAITING, name, queue, message=counts)
        total = sum(c for _, c in counts)
        return Gate(Admission.ADMITTED, name, queue, count=total, role_counts=counts)
    # Admitted without a count is admitted whole. A count outside [min, max] is never
    # stretched to fit: more pods than admitted would run on quota nobody reserved.
    count = job.max_replicas if view.count is None else view.count
    if not job.min_replicas <= count <= job.max_replicas:
        return Gate(
            Admission.WAITING,
            name,
            queue,
            message=f"Kueue admitted {count} pods, outside {job.min_replicas}-{job.max_replicas}",
        )
    return Gate(Admission.ADMITTED, name, queue, count=count)


def _range(count: int | None, min_count: int | None) -> str:
    return f"{count}" if min_count is None or min_count == count else f"{min_count}-{count}"


def _asked_text(view: WorkloadView) -> str:
    if len(view.asked_sets) == 1 and view.asked_sets[0][0] == POD_SET:
        count, min_count = view.asked
        return f"{min_count}-{count}"
    return ", ".join(f"{n} {_range(c, m)}" for n, c, m in view.asked_sets)


def _job_text(job: JobSpec) -> str:
    if not job.multi_role:
        return f"{job.min_replicas}-{job.max_replicas}"
    return ", ".join(f"{n} {_range(c, m)}" for n, c, m in asked(job))


def must_read(
    job: JobSpec, cached: WorkloadView | None, age_s: float | None, poll_s: float
) -> bool:
    """Whether a pass reads the Workload from the API rather than the watch's cache
    (read ``age_s`` ago; None: never): when none is cached, while Kueue holds the job,
    and once per ``poll_s`` while it runs. Admission and eviction are then seen even
    where the watch could not start (Kueue's CRDs installed after the operator)."""
    if cached is None or age_s is None or age_s >= poll_s:
        return True
    g = gate(job, cached)
    return g is not None and g.holds


class WorkloadAction(enum.Enum):
    NONE = "none"
    CREATE = "create"
    RELEASE = "release"
    """Evicted and no pod left: give the quota reservation back (Kueue requeues it)."""
    FINISH = "finish"
    """The job finished: mark the Workload Finished (frees the quota)."""
    DELETE = "delete"
    """The job names no queue any more, or its replicas changed (``stale``) and no pod
    is left: delete the Workload (frees its quota; a stale one is created anew)."""


def workload_action(
    job: JobSpec, view: WorkloadView | None, phase: Phase | None, pods_left: int
) -> WorkloadAction:
    """What the reconciler writes on the Workload after the pass (pure). ``view`` is
    also given for a job whose queue label was removed (from the watch's cache)."""
    if job.deleting:
        return WorkloadAction.NONE  # the garbage collector deletes it with the job
    finished = phase is not None and phase.finished
    if job.queue_name is None:
        # Unlabelled, the job runs ungated: its Workload must not keep quota reserved.
        gone = view is None or view.finished
        return WorkloadAction.NONE if gone else WorkloadAction.DELETE
    if view is None:
        return WorkloadAction.NONE if finished else WorkloadAction.CREATE
    if view.finished:
        return WorkloadAction.NONE
    if finished:
        return WorkloadAction.FINISH
    if view.evicted and view.quota_reserved and pods_left == 0:
        return WorkloadAction.RELEASE
    if stale(job, view) and pods_left == 0:
        return WorkloadAction.DELETE
    return WorkloadAction.NONE


def _set(
    conditions: Sequence[Mapping[str, Any]], new: Manifest, now: dt.datetime
) -> list[Manifest]:
    """``conditions`` with ``new`` set (metav1.Condition: the time moves on a change only)."""
    out: list[Manifest] = []
    for cond in conditions:
        if cond.get("type") != new["type"]:
            out.append(dict(cond))
    old = kueue.find_condition(conditions, new["type"])
    unchanged = old is not None and old.get("status") == new["status"]
    when = old.get("lastTransitionTime") if unchanged and old is not None else format_time(now)
    out.append({**new, "lastTransitionTime": when})
    return out


def release_patch(view: WorkloadView, now: dt.datetime) -> Manifest:
    """The status merge patch that gives an evicted Workload's quota back, as Kueue's
    own job controllers do: Requeued, QuotaReserved=False (Pending), no admission,
    Admitted=False. The whole conditions list is sent (a merge patch replaces lists)."""
    conds: Sequence[Mapping[str, Any]] = view.conditions
    gen = view.generation
    requeued = "True" if view.evicted_reason in set(KueueEvictionReason) else "False"
    for new in (
        {
            "type": REQUEUED,
            "status": requeued,
            "reason": view.evicted_reason or KueueConditionReason.EVICTED.value,
            "message": view.message,
        },
        {
            "type": QUOTA_RESERVED,
            "status": "False",
            "reason": KueueConditionReason.PENDING.value,
            "message": view.message,
        },
        {
            "type": ADMITTED,
            "status": "False",
            "reason": KueueConditionReason.NO_RESERVATION.value,
            "message": "The workload has no reservation",
        },
    ):
        conds = _set(conds, {**new, "observedGeneration": gen}, now)
    return {"conditions": conds, "admission": None}


def finished_patch(view: WorkloadView, phase: Phase, now: dt.datetime) -> Manifest:
    """The status merge patch that marks the Workload Finished (Kueue frees its quota)."""
    succeeded = phase is Phase.SUCCEEDED
    new = {
        "type": FINISHED,
        "status": "True",
        "reason": (
            KueueConditionReason.SUCCEEDED if succeeded else KueueConditionReason.FAILED
        ).value,
        "message": "the ElasticJob " + ("succeeded" if succeeded else "failed"),
        "observedGeneration": view.generation,
    }
    return {"conditions": _set(view.conditions, new, now)}
