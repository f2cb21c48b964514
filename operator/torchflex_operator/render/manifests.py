"""The parts every manifest of a job shares: owner reference, labels, pod and Service shells.

Where it sits: under ``builders`` (worker pods, the job's Services) and
``backends`` (each rendezvous backend's own pod) and ``netpol``; pure
functions of the ``JobSpec``, no API calls. Kept apart from ``builders`` so
that a backend's module can build its pod without importing the builder that
asks it for one.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from torchflex_contract import labels
from torchflex_contract.labels import Label, PodKind
from torchflex_operator.model.spec import JobSpec
from torchflex_operator.model.vocabulary import AutoscalerAnnotation

Manifest = dict[str, Any]


def owner_ref(job: JobSpec) -> Manifest:
    return {
        "apiVersion": labels.API_VERSION,
        "kind": labels.KIND,
        "name": job.name,
        "uid": job.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def object_labels(job: JobSpec, kind: PodKind, index: int | None = None) -> dict[str, str]:
    out = {
        Label.JOB_NAME.value: job.name,
        Label.ROLE.value: kind.value,
        Label.MANAGED_BY.value: labels.MANAGED_BY_VALUE,
    }
    if index is not None:
        out[Label.REPLICA_INDEX.value] = str(index)
    return out


def role_labels(job: JobSpec) -> dict[str, str]:
    """The training-role label of what belongs to one role of a multi-role job (a
    ``JobSpec.role_view``): its pods, budget and PodGroup; none for a job of one group."""
    if not job.roles:
        return {}
    return {Label.TRAINING_ROLE.value: job.role}


def role_object_name(job: JobSpec) -> str:
    """The name of an object a job owns once per worker group (budget, PodGroup): the
    job's name for a job of one group, ``<job>-<role>`` for a role of a multi-role job."""
    return f"{job.name}-{job.role}" if job.roles else job.name


def safe_to_evict(kind: PodKind) -> dict[str, str]:
    """cluster-autoscaler's annotation for a pod of ``kind``: workers may be drained
    (the job's PodDisruptionBudget holds its minimum), the store and etcd pods not
    (see ``render.pdb``)."""
    value = "true" if kind is PodKind.WORKER else "false"
    return {AutoscalerAnnotation.SAFE_TO_EVICT.value: value}


def trainer_container(pod_spec: Manifest) -> Manifest:
    for container in pod_spec.get("containers") or []:
        if container.get("name") == labels.TRAINER_CONTAINER:
            return container  # type: ignore[no-any-return]
    raise ValueError("template has no container named 'trainer'")


def aux_pod(job: JobSpec, name: str, kind: PodKind, container: Manifest) -> Manifest:
    """Store/etcd pod: placed like the workers (selectors, tolerations), one container."""
    src: Manifest = dict(job.template.get("spec") or {})
    pod_spec: Manifest = {
        key: copy.deepcopy(src[key])
        for key in (
            "nodeSelector",
            "tolerations",
            "affinity",
            "imagePullSecrets",
            "serviceAccountName",
            "priorityClassName",
            "securityContext",
            "automountServiceAccountToken",
        )
        if key in src
    }
    pod_spec.setdefault("automountServiceAccountToken", False)
    pod_spec["containers"] = [container]
    pod_spec["restartPolicy"] = "Always"
    pod_spec["hostname"] = name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": job.namespace,
            "labels": object_labels(job, kind),
            "annotations": safe_to_evict(kind),
            "ownerReferences": [owner_ref(job)],
        },
        "spec": pod_spec,
    }


def headless_service(job: JobSpec, name: str, kind: PodKind, port: int | None) -> Manifest:
    spec: Manifest = {
        "clusterIP": "None",
        # DNS must work before readiness: agents rendezvous while starting.
        "publishNotReadyAddresses": True,
        "selector": {Label.JOB_NAME.value: job.name, Label.ROLE.value: kind.value},
    }
    if port is not None:
        spec["ports"] = [{"name": kind.value, "port": port, "targetPort": port}]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": job.namespace,
            "labels": object_labels(job, kind),
            "ownerReferences": [owner_ref(job)],
        },
        "spec": spec,
    }


def thaw(value: Any) -> Any:
    """A fresh, mutable copy of a frozen manifest fragment (mappings become dicts,
    tuples lists), to merge into a manifest being built."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [thaw(v) for v in value]
    return value
