"""API group, kind, label and annotation keys, and resource names.

Where it sits: used by the operator to build and select objects, by the e2e
harness and tests to find them, and by nothing in the hot path of the agent.
"""

from __future__ import annotations

import enum
from typing import Final

GROUP: Final = "torchflex.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "ElasticJob"
PLURAL: Final = "elasticjobs"
SHORT_NAME: Final = "ej"
CATEGORY: Final = "torchflex"

TRAINER_CONTAINER: Final = "trainer"


class Label(enum.StrEnum):
    """Labels the operator puts on every object it owns."""

    JOB_NAME = "torchflex.io/job-name"
    ROLE = "torchflex.io/role"
    REPLICA_INDEX = "torchflex.io/replica-index"
    MANAGED_BY = "app.kubernetes.io/managed-by"
    TRAINING_ROLE = "torchflex.io/training-role"
    """On the worker pods of a multi-role job (``spec.roles``) only: the pod's training
    role (its worker group), distinct from ``ROLE``, which stays the pod kind
    (``worker``) so that selectors, the headless Service and the NetworkPolicy keep
    working. A job of one group's pods carry none (their group is ``WORKER_ROLE``)."""
    STANDBY = "torchflex.io/standby"
    """On warm spares only, mirroring ``Annotation.STANDBY`` (``"true"``, set to
    ``"false"`` by the same patch that promotes one): selectors such as the job's
    PodDisruptionBudget can leave spares out (annotations select nothing)."""


MANAGED_BY_VALUE: Final = "torchflex-operator"


class PodKind(enum.StrEnum):
    """What an owned pod is for: the value of its ``Label.ROLE`` (the label keeps its
    key and values): a worker of the training, or a pod holding the rendezvous store.
    Not the training role: every worker pod is of kind ``WORKER``, whatever its group."""

    WORKER = "worker"
    STORE = "store"
    ETCD = "etcd"


WORKER_ROLE: Final = "worker"
"""The training role of a job's one worker group: a group of worker pods (kind
``WORKER``) started from one template. A job without ``spec.roles`` has this one role;
a multi-role job's roles are named by its spec (``torchflex_contract.roles``; this
name is reserved there) and its pods labelled ``Label.TRAINING_ROLE``. The operator's
planner and pod builders take the role as a parameter."""


class Annotation(enum.StrEnum):
    """Annotations the operator reads or writes."""

    SPEC_HASH = "torchflex.io/spec-hash"
    """Hash of the pod spec a pod was built from (rolling changes)."""
    REPLICAS_DEFAULTED = "torchflex.io/replicas-defaulted"
    """On the job: the ``spec.replicas`` the operator wrote for an absent one
    (``maxReplicas``); while the field still holds it, it follows ``maxReplicas``."""
    STANDBY = "torchflex.io/standby"
    """On a worker pod: ``"true"`` while it is a warm spare (``spec.warmSpares``:
    running, prewarmed, not in the rendezvous); the operator sets ``"false"``
    to promote it. Projected into the pod as ``env.STANDBY_FILE``."""


def worker_pod_name(job: str, index: int, role: str = WORKER_ROLE) -> str:
    """Deterministic worker pod name: a 409 on create means it exists."""
    return f"{job}-{role}-{index}"


def store_pod_name(job: str) -> str:
    return f"{job}-store"


def workers_service_name(job: str) -> str:
    """Headless Service giving each worker ``<pod>.<service>`` DNS."""
    return f"{job}-workers"


def store_service_name(job: str) -> str:
    return f"{job}-store"


def etcd_pod_name(job: str) -> str:
    """Operator-managed single-member etcd (``rendezvous.managedEtcd``)."""
    return f"{job}-etcd"


def etcd_service_name(job: str) -> str:
    return f"{job}-etcd"


def network_policy_name(job: str) -> str:
    """The job's NetworkPolicy (``spec.networkPolicy.enabled``)."""
    return f"{job}-isolation"


def worker_selector(job: str, training_role: str | None = None) -> str:
    """Label selector of a job's worker pods (``status.selector``, scale subresource);
    with ``training_role``, of that role's pods only (a multi-role job's scale role)."""
    selector = f"{Label.JOB_NAME}={job},{Label.ROLE}={PodKind.WORKER}"
    if training_role is None:
        return selector
    return f"{selector},{Label.TRAINING_ROLE}={training_role}"
