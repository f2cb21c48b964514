"""Manifests of the objects a job owns: worker pods and the job's Services.

Where it sits: called by the planner; pure functions from ``JobSpec`` (+
``Settings``) to dicts ready for the API. This is where the env contract of
``torchflex_contract.env`` is written onto the trainer container and the
user's command is wrapped in ``torchflex-agent --``. What depends on the
rendezvous backend (the endpoint, the store or etcd pod and its Service)
comes from ``backends``; the shells every manifest shares from ``manifests``.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
from collections.abc import Sequence

from torchflex_contract import env, labels
from torchflex_contract.labels import Annotation, PodKind
from torchflex_contract.roles import format_role_sizes
from torchflex_operator.model.settings import Settings
from torchflex_operator.model.spec import JobSpec, SharedMemory
from torchflex_operator.model.vocabulary import GangScheduling
from torchflex_operator.render import backends, podgroup
from torchflex_operator.render.manifests import (
    Manifest,
    headless_service,
    object_labels,
    owner_ref,
    role_labels,
    safe_to_evict,
    trainer_container,
)

GPU_RESOURCE = "nvidia.com/gpu"
_WRAPPED = ("torchflex-agent", "torchrun")
_TLS_VOLUME = "torchflex-rdzv-tls"
_SHM_VOLUME = "torchflex-shm"
SHM_PATH = "/dev/shm"
_NODE_LOSS_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def template_hash(job: JobSpec) -> str:
    """Hash of every spec field baked into a worker pod (``spec.replicas`` is not one).

    Pods carry it in ``torchflex.io/spec-hash``; a pod whose hash differs is
    out of date and the planner rolls it (see ``planning.steps.rolling``).
    """
    baked = {
        "template": job.template,
        "minReplicas": job.min_replicas,
        "maxReplicas": job.max_replicas,
        "nprocPerNode": job.nproc_per_node,
        "maxRestarts": job.max_restarts,
        "rendezvous": dataclasses.asdict(job.rendezvous),
    }
    # Only a non-default value is hashed: a job created before spec.sharedMemory
    # existed keeps its hash, so an operator upgrade rolls none of its pods.
    if job.shared_memory != SharedMemory():
        baked["sharedMemory"] = dataclasses.asdict(job.shared_memory)
    if job.roles:
        # A role view (``JobSpec.role_view``): template, range and nprocPerNode above are
        # the role's; every role's range and the coupling are in each pod's env too.
        baked["role"] = job.role
        baked["coupling"] = job.coupling.value
        baked["roleSizes"] = format_role_sizes(job.role_sizes)
        if job.job_scoped_roles:  # only when set: jobs from before keep their hash
            baked["jobScopedRoles"] = ",".join(job.job_scoped_roles)
    raw = json.dumps(baked, sort_keys=True, default=str).encode()
    return hashlib.sha256(raw).hexdigest()[:16]


def wrap_command(container: Manifest, agent_command: str) -> None:
    """Run the user's training command under the agent, unless it already is."""
    command = list(container.get("command") or [])
    args = list(container.get("args") or [])
    if not command and not args:
        raise ValueError("trainer container needs a command")
    first = os.path.basename((command or args)[0])
    if first in _WRAPPED or first == os.path.basename(agent_command):
        return
    container["command"] = [agent_command, "--", *command, *args]
    container.pop("args", None)


def _has_gpu_limit(container: Manifest) -> bool:
    return GPU_RESOURCE in ((container.get("resources") or {}).get("limits") or {})


def contract_env(job: JobSpec, index: int, container: Manifest) -> list[Manifest]:
    rdzv = job.rendezvous
    pod_spec = job.template.get("spec", {})
    grace = int(pod_spec.get("terminationGracePeriodSeconds", env.POD_GRACE_DEFAULT_S))

    def lit(name: str, value: object) -> Manifest:
        return {"name": name, "value": str(value)}

    def field(name: str, path: str) -> Manifest:
        return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}

    out = [
        lit(env.JOB_NAME, job.name),
        field(env.NAMESPACE, "metadata.namespace"),
        field(env.POD_NAME, "metadata.name"),
        field(env.POD_IP, "status.podIP"),
        lit(env.REPLICA_INDEX, index),
        lit(env.NNODES, f"{job.min_replicas}:{job.max_replicas}"),
        lit(env.NPROC_PER_NODE, job.nproc_per_node),
        lit(env.RDZV_BACKEND, rdzv.backend.value),
        lit(env.RDZV_ENDPOINT, backends.endpoint(job)),
        lit(env.RDZV_ID, job.rdzv_id),
        lit(env.RDZV_JOIN_TIMEOUT, rdzv.join_timeout_s),
        lit(env.RDZV_LAST_CALL, rdzv.last_call_s),
        lit(env.MAX_RESTARTS, job.max_restarts),
        # Leave the agent a margin before the kubelet's SIGKILL.
        lit(env.TERMINATION_GRACE, max(1, grace - env.TERMINATION_GRACE_MARGIN_S)),
    ]
    if job.roles:  # a role view: NNODES and NPROC_PER_NODE above are the role's
        out.append(lit(env.ROLE, job.role))
        out.append(lit(env.COUPLING, job.coupling.value))
        out.append(lit(env.ROLE_SIZES, format_role_sizes(job.role_sizes)))
        if job.job_scoped_roles:
            out.append(lit(env.JOB_SCOPED_ROLES, ",".join(job.job_scoped_roles)))
    if job.hang_timeout_s is not None:  # unset: the agent derives it (and the spec hash stays)
        out.append(lit(env.HANG_TIMEOUT, job.hang_timeout_s))
    if job.node_check:
        out.append(lit(env.NODE_CHECK, "on"))
    if rdzv.tls_secret_name:
        out.append(lit(env.RDZV_TLS_DIR, env.RDZV_TLS_MOUNT))
    if _has_gpu_limit(container):
        out.append(
            {
                "name": env.GPU_LIMIT,
                "valueFrom": {
                    "resourceFieldRef": {
                        "containerName": labels.TRAINER_CONTAINER,
                        "resource": f"limits.{GPU_RESOURCE}",
                    }
                },
            }
        )
    return out


def _keep_off(pod_spec: Manifest, nodes: Sequence[str]) -> None:
    """Require a node not in ``nodes`` (``status.avoidedNodes``): a ``metadata.name NotIn``
    field selector ANDed into every required term the template has (or the only term).
    Not covered by the spec hash: a pod already running stays where it is."""
    if not nodes:
        return
    keep_off = {"key": "metadata.name", "operator": "NotIn", "values": sorted(nodes)}
    affinity = dict(pod_spec.get("affinity") or {})
    node_aff = dict(affinity.get("nodeAffinity") or {})
    required = dict(node_aff.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = [dict(t) for t in required.get("nodeSelectorTerms") or [{}]]
    for term in terms:
        term["matchFields"] = [*(term.get("matchFields") or []), keep_off]
    required["nodeSelectorTerms"] = terms
    node_aff["requiredDuringSchedulingIgnoredDuringExecution"] = required
    affinity["nodeAffinity"] = node_aff
    pod_spec["affinity"] = affinity


def _node_loss_tolerations(pod_spec: Manifest, seconds: int) -> None:
    tolerations = list(pod_spec.get("tolerations") or [])
    present = {t.get("key") for t in tolerations}
    for key in _NODE_LOSS_TAINTS:
        if key not in present:
            tolerations.append(
                {
                    "key": key,
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": seconds,
                }
            )
    pod_spec["tolerations"] = tolerations


def _mount_volume(
    pod_spec: Manifest, container: Manifest, volume: Manifest, mount: Manifest
) -> None:
    container["volumeMounts"] = [*(container.get("volumeMounts") or []), mount]
    pod_spec["volumes"] = [*(pod_spec.get("volumes") or []), volume]


def _shared_memory(job: JobSpec, pod_spec: Manifest, container: Manifest) -> None:
    """A memory-backed /dev/shm: a container runtime's default is 64 MiB, where
    DataLoader workers passing batches through shared memory die with a bus
    error. A template that mounts its own /dev/shm keeps it."""
    shm = job.shared_memory
    if not shm.enabled or any(
        m.get("mountPath", "").rstrip("/") == SHM_PATH for m in container.get("volumeMounts") or []
    ):
        return
    _mount_volume(
        pod_spec,
        container,
        {"name": _SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": shm.size_limit}},
        {"name": _SHM_VOLUME, "mountPath": SHM_PATH},
    )


def _standby(pod_spec: Manifest, container: Manifest) -> None:
    """A spare's agent reads its ``torchflex.io/standby`` annotation from a file: the
    kubelet refreshes a downward-API file when the annotation changes, so promoting
    the spare is one patch, with no restart (members get none of this)."""
    _mount_volume(
        pod_spec,
        container,
        {
            "name": env.STANDBY_VOLUME,
            "downwardAPI": {
                "items": [
                    {
                        "path": env.STANDBY_FILE_NAME,
                        "fieldRef": {
                            "fieldPath": f"metadata.annotations['{Annotation.STANDBY.value}']"
                        },
                    }
                ]
            },
        },
        {"name": env.STANDBY_VOLUME, "mountPath": env.STANDBY_MOUNT_DIR, "readOnly": True},
    )
    path = f"{env.STANDBY_MOUNT_DIR}/{env.STANDBY_FILE_NAME}"
    rest = [e for e in container.get("env") or [] if e.get("name") != env.STANDBY_FILE]
    container["env"] = [*rest, {"name": env.STANDBY_FILE, "value": path}]


def worker_pod(
    job: JobSpec,
    index: int,
    settings: Settings,
    *,
    spare: bool = False,
    role: str | None = None,
    avoid: Sequence[str] = (),
) -> Manifest:
    """Worker pod ``index`` of training role ``role`` (default ``job.role``: a job of one
    group's ``WORKER_ROLE``, or the role of a ``JobSpec.role_view``, whose template, range
    and env it gets); ``spare``: a warm spare (``planning.steps.spares``), the standby
    annotation and its file added (nothing the spec hash covers changes)."""
    role = role or job.role
    if job.roles and (job.role == labels.WORKER_ROLE or role != job.role):
        raise ValueError("role r of a multi-role job is built from job.role_view(r)")
    template = copy.deepcopy(dict(job.template))
    meta = dict(template.get("metadata") or {})
    pod_spec: Manifest = dict(template.get("spec") or {})
    name = labels.worker_pod_name(job.name, index, role)
    container = trainer_container(pod_spec)
    wrap_command(container, settings.agent_command)
    ours = {e["name"] for e in contract_env(job, index, container)}
    user_env = [e for e in container.get("env") or [] if e.get("name") not in ours]
    # User env last, so a user may reference ours with $(VAR); ours win on name clash.
    container["env"] = contract_env(job, index, container) + user_env
    container.setdefault("terminationMessagePolicy", "FallbackToLogsOnError")
    if job.rendezvous.tls_secret_name:
        _mount_volume(
            pod_spec,
            container,
            {"name": _TLS_VOLUME, "secret": {"secretName": job.rendezvous.tls_secret_name}},
            {"name": _TLS_VOLUME, "mountPath": env.RDZV_TLS_MOUNT, "readOnly": True},
        )
    _shared_memory(job, pod_spec, container)
    if spare:
        _standby(pod_spec, container)
    pod_spec["restartPolicy"] = "Never"  # the agent restarts workers; a pod exit is final
    # The agent never calls the API: no token unless the template asks for one.
    pod_spec.setdefault("automountServiceAccountToken", False)
    pod_spec["hostname"] = name
    pod_spec["subdomain"] = labels.workers_service_name(job.name)
    _node_loss_tolerations(pod_spec, settings.node_loss_toleration_s)
    _keep_off(pod_spec, avoid)
    if settings.gang_scheduling is GangScheduling.ENABLED:
        pod_spec["schedulingGroup"] = podgroup.scheduling_group(job)
    pod_labels = {
        **(meta.get("labels") or {}),
        **object_labels(job, PodKind.WORKER, index),
        **role_labels(job),
    }
    annotations = {
        **safe_to_evict(PodKind.WORKER),  # a template's own value wins
        **(meta.get("annotations") or {}),
        Annotation.SPEC_HASH.value: template_hash(job),
    }
    if spare:
        annotations[Annotation.STANDBY.value] = env.STANDBY_TRUE
        pod_labels[labels.Label.STANDBY.value] = env.STANDBY_TRUE
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": job.namespace,
            "labels": pod_labels,
            "annotations": annotations,
            "ownerReferences": [owner_ref(job)],
        },
        "spec": pod_spec,
    }


def services(job: JobSpec) -> list[Manifest]:
    """Every Service the job needs: the workers', and its rendezvous host's if it has one."""
    out = [headless_service(job, labels.workers_service_name(job.name), PodKind.WORKER, None)]
    host = backends.host(job)
    if host is not None:
        out.append(host.service(job))
    return out
