"""Gang scheduling of a job's minimum: its PodGroup and the worker pods' link to it.

Where it sits: pure, beside ``builders``. Kubernetes v1.37 serves PodGroups
(``scheduling.k8s.io/v1beta1``, behind the GenericWorkload feature gate, beta
and off by default); its scheduler places at least ``minCount`` pods of a
group with a gang policy together, or none of them. Each job owns one
PodGroup, named like the job, whose gang ``minCount`` is ``minReplicas``;
its worker pods name it in ``spec.schedulingGroup`` (``builders.worker_pod``).
Two jobs that could each get part of the cluster then never hold half of it
each while waiting for the rest: one gets its minimum, the other waits whole.

The reconciler asks the API once per process whether it serves PodGroups
(``Kube.pod_groups_served``, discovery) and keeps the answer in
``Settings.gang_scheduling`` (``mode``): ``UNAVAILABLE`` is the behaviour of
clusters without the API (no PodGroup, no link: pods are placed one by one)
and ``status.gangScheduling`` says which. Store and etcd pods stay outside
the gang: the group needs its store, not the other way round. No Workload
object is written: a PodGroup's ``workloadRef`` is optional, and the
Workload's templates would only repeat the group's one policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torchflex_contract.labels import PodKind
from torchflex_operator.model.settings import Settings
from torchflex_operator.model.spec import JobSpec
from torchflex_operator.model.vocabulary import GangScheduling
from torchflex_operator.render.manifests import (
    Manifest,
    object_labels,
    owner_ref,
    role_labels,
    role_object_name,
)

GROUP = "scheduling.k8s.io"
VERSION = "v1beta1"
PLURAL = "podgroups"
KIND = "PodGroup"
API_VERSION = f"{GROUP}/{VERSION}"


def pod_group_name(job: JobSpec) -> str:
    """The job's PodGroup is named like the job (``kubectl get podgroup <job>``); each
    role of a multi-role job has its own gang, ``<job>-<role>``, of the role's minimum."""
    return role_object_name(job)


def pod_group(job: JobSpec) -> Manifest:
    """The job's PodGroup: a gang of at least ``minReplicas`` worker pods, owned by the job
    (the garbage collector deletes it with the job)."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": pod_group_name(job),
            "namespace": job.namespace,
            "labels": {**object_labels(job, PodKind.WORKER), **role_labels(job)},
            "ownerReferences": [owner_ref(job)],
        },
        "spec": {"schedulingPolicy": {"gang": {"minCount": job.min_replicas}}},
    }


def scheduling_group(job: JobSpec) -> Manifest:
    """A worker pod's ``spec.schedulingGroup`` (immutable on the pod; the group's
    ``minCount`` is not)."""
    return {"podGroupName": pod_group_name(job)}


def min_count(group: Mapping[str, Any]) -> int | None:
    """The gang ``minCount`` of a PodGroup as read from the API; None: no gang policy."""
    policy = ((group.get("spec") or {}).get("schedulingPolicy") or {}).get("gang")
    if not isinstance(policy, Mapping):
        return None
    value = policy.get("minCount")
    return value if isinstance(value, int) else None


def min_count_patch(want: Mapping[str, Any], group: Mapping[str, Any]) -> Manifest | None:
    """The merge patch that brings an existing PodGroup's ``minCount`` to the one of
    ``want`` (a ``pod_group`` manifest).

    None when it already matches, or when the group has no gang policy: the
    policy kind cannot change after creation, so a same-named group someone
    else created with a basic policy is left as it is.
    """
    current, wanted = min_count(group), min_count(want)
    if current is None or wanted is None or current == wanted:
        return None
    return {"spec": {"schedulingPolicy": {"gang": {"minCount": wanted}}}}


def needs_write(job: JobSpec, written: int | None) -> bool:
    """Whether this process must (re)write the job's PodGroup: it has not written
    one yet, or wrote another ``minCount`` (``minReplicas`` changed)."""
    return written != job.min_replicas


def pods_at_once(job: JobSpec, settings: Settings) -> int:
    """How many worker pods creation must allow unscheduled at once (``planning.rules.pacing``):
    the gang's minimum, which the scheduler waits to see whole before placing any."""
    return job.min_replicas if settings.gang_scheduling is GangScheduling.ENABLED else 0


def mode(served: bool) -> GangScheduling:
    """What discovery's answer means for every job of this process."""
    return GangScheduling.ENABLED if served else GangScheduling.UNAVAILABLE
