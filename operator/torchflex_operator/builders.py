"""Manifests of the objects a job owns: worker pods, store/etcd pods, Services.

Where it sits: called by the planner; pure functions from ``JobSpec`` (+
``Settings``) to dicts ready for the API. This is where the env contract of
``torchflex_contract.env`` is written onto the trainer container and the
user's command is wrapped in ``torchflex-agent --``.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
from typing import Any

from torchflex_contract import env, labels
from torchflex_contract.labels import Annotation, Label, Role
from torchflex_operator.settings import Settings
from torchflex_operator.spec import Backend, JobSpec

GPU_RESOURCE = "nvidia.com/gpu"
STORE_REQUESTS = {"cpu": "100m", "memory": "512Mi"}
"""The store process imports torch for its TCPStore: a few hundred MiB resident."""
_WRAPPED = ("torchflex-agent", "torchrun")
_TLS_VOLUME = "torchflex-rdzv-tls"
_NODE_LOSS_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")

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


def object_labels(job: JobSpec, role: Role, index: int | None = None) -> dict[str, str]:
    out = {
        Label.JOB_NAME.value: job.name,
        Label.ROLE.value: role.value,
        Label.MANAGED_BY.value: labels.MANAGED_BY_VALUE,
    }
    if index is not None:
        out[Label.REPLICA_INDEX.value] = str(index)
    return out


def rdzv_endpoint(job: JobSpec) -> str:
    """``<service>.<namespace>:<port>``: resolvable through the pod's DNS search path
    on any cluster domain (no hard-coded ``cluster.local``)."""
    rdzv = job.rendezvous
    if rdzv.backend is Backend.C10D:
        svc = labels.store_service_name(job.name)
        return f"{svc}.{job.namespace}:{env.DEFAULT_STORE_PORT}"
    if rdzv.managed_etcd:
        svc = labels.etcd_service_name(job.name)
        return f"http://{svc}.{job.namespace}:{env.DEFAULT_ETCD_PORT}"
    return rdzv.endpoint or ""


def template_hash(job: JobSpec) -> str:
    """Hash of every spec field baked into a worker pod (``spec.replicas`` is not one).

    Pods carry it in ``torchflex.io/spec-hash``; a pod whose hash differs is
    out of date and the planner rolls it (see ``planner._Pass.roll``).
    """
    baked = {
        "template": job.template,
        "minReplicas": job.min_replicas,
        "maxReplicas": job.max_replicas,
        "nprocPerNode": job.nproc_per_node,
        "maxRestarts": job.max_restarts,
        "rendezvous": dataclasses.asdict(job.rendezvous),
    }
    raw = json.dumps(baked, sort_keys=True, default=str).encode()
    return hashlib.sha256(raw).hexdigest()[:16]


def _trainer(pod_spec: Manifest) -> Manifest:
    for container in pod_spec.get("containers") or []:
        if container.get("name") == labels.TRAINER_CONTAINER:
            return container  # type: ignore[no-any-return]
    raise ValueError("template has no container named 'trainer'")


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
    grace = int(job.template.get("spec", {}).get("terminationGracePeriodSeconds", 30))

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
        lit(env.RDZV_ENDPOINT, rdzv_endpoint(job)),
        lit(env.RDZV_ID, job.rdzv_id),
        lit(env.RDZV_JOIN_TIMEOUT, rdzv.join_timeout_s),
        lit(env.RDZV_LAST_CALL, rdzv.last_call_s),
        lit(env.MAX_RESTARTS, job.max_restarts),
        # Leave the agent a margin before the kubelet's SIGKILL.
        lit(env.TERMINATION_GRACE, max(1, grace - 5)),
    ]
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


def worker_pod(job: JobSpec, index: int, settings: Settings) -> Manifest:
    template = copy.deepcopy(dict(job.template))
    meta = dict(template.get("metadata") or {})
    pod_spec: Manifest = dict(template.get("spec") or {})
    name = labels.worker_pod_name(job.name, index)
    container = _trainer(pod_spec)
    wrap_command(container, settings.agent_command)
    ours = {e["name"] for e in contract_env(job, index, container)}
    user_env = [e for e in container.get("env") or [] if e.get("name") not in ours]
    # User env last, so a user may reference ours with $(VAR); ours win on name clash.
    container["env"] = contract_env(job, index, container) + user_env
    container.setdefault("terminationMessagePolicy", "FallbackToLogsOnError")
    if job.rendezvous.tls_secret_name:
        mounts = list(container.get("volumeMounts") or [])
        mounts.append({"name": _TLS_VOLUME, "mountPath": env.RDZV_TLS_MOUNT, "readOnly": True})
        container["volumeMounts"] = mounts
        volumes = list(pod_spec.get("volumes") or [])
        volumes.append(
            {"name": _TLS_VOLUME, "secret": {"secretName": job.rendezvous.tls_secret_name}}
        )
        pod_spec["volumes"] = volumes
    pod_spec["restartPolicy"] = "Never"  # the agent restarts workers; a pod exit is final
    # The agent never calls the API: no token unless the template asks for one.
    pod_spec.setdefault("automountServiceAccountToken", False)
    pod_spec["hostname"] = name
    pod_spec["subdomain"] = labels.workers_service_name(job.name)
    _node_loss_tolerations(pod_spec, settings.node_loss_toleration_s)
    pod_labels = {**(meta.get("labels") or {}), **object_labels(job, Role.WORKER, index)}
    annotations = {
        **(meta.get("annotations") or {}),
        Annotation.SPEC_HASH.value: template_hash(job),
    }
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


def _aux_pod(job: JobSpec, name: str, role: Role, container: Manifest) -> Manifest:
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
            "labels": object_labels(job, role),
            "ownerReferences": [owner_ref(job)],
        },
        "spec": pod_spec,
    }


def store_pod(job: JobSpec, settings: Settings) -> Manifest:
    trainer = _trainer(dict(job.template.get("spec") or {}))
    container: Manifest = {
        "name": "store",
        "image": trainer.get("image", ""),
        "command": [settings.agent_command, "store", "--port", str(env.DEFAULT_STORE_PORT)],
        "ports": [{"name": "store", "containerPort": env.DEFAULT_STORE_PORT}],
        # Requests: never BestEffort, the first pod evicted under node pressure.
        # No limits: an OOM kill of the store would stop every agent's rendezvous.
        "resources": {"requests": dict(STORE_REQUESTS)},
        # A TCP probe catches a dead or wedged listener (the kubelet restarts
        # the container); a frozen process still completes TCP handshakes in
        # the kernel, so that case is the agents' verdict (store_error, see
        # fencing.py) on which the operator replaces the pod.
        "readinessProbe": {
            "tcpSocket": {"port": env.DEFAULT_STORE_PORT},
            "periodSeconds": 5,
            "failureThreshold": 2,
        },
        "livenessProbe": {
            "tcpSocket": {"port": env.DEFAULT_STORE_PORT},
            "initialDelaySeconds": 30,
            "periodSeconds": 10,
            "timeoutSeconds": 2,
            "failureThreshold": 3,
        },
    }
    if "imagePullPolicy" in trainer:
        container["imagePullPolicy"] = trainer["imagePullPolicy"]
    return _aux_pod(job, labels.store_pod_name(job.name), Role.STORE, container)


def etcd_pod(job: JobSpec, settings: Settings) -> Manifest:
    name = labels.etcd_pod_name(job.name)
    client_url = (
        f"http://{labels.etcd_service_name(job.name)}.{job.namespace}:{env.DEFAULT_ETCD_PORT}"
    )
    container: Manifest = {
        "name": "etcd",
        "image": settings.etcd_image,
        "command": [
            settings.etcd_command,
            "--name",
            name,
            "--data-dir",
            "/tmp/etcd-data",
            "--listen-client-urls",
            f"http://0.0.0.0:{env.DEFAULT_ETCD_PORT}",
            "--advertise-client-urls",
            client_url,
            "--listen-peer-urls",
            "http://127.0.0.1:2380",
        ],
        "ports": [{"name": "client", "containerPort": env.DEFAULT_ETCD_PORT}],
    }
    return _aux_pod(job, name, Role.ETCD, container)


def headless_service(job: JobSpec, name: str, role: Role, port: int | None) -> Manifest:
    spec: Manifest = {
        "clusterIP": "None",
        # DNS must work before readiness: agents rendezvous while starting.
        "publishNotReadyAddresses": True,
        "selector": {Label.JOB_NAME.value: job.name, Label.ROLE.value: role.value},
    }
    if port is not None:
        spec["ports"] = [{"name": role.value, "port": port, "targetPort": port}]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": job.namespace,
            "labels": object_labels(job, role),
            "ownerReferences": [owner_ref(job)],
        },
        "spec": spec,
    }


def services(job: JobSpec) -> list[Manifest]:
    """Every Service the job needs, by its rendezvous backend."""
    out = [headless_service(job, labels.workers_service_name(job.name), Role.WORKER, None)]
    if job.rendezvous.backend is Backend.C10D:
        out.append(
            headless_service(
                job, labels.store_service_name(job.name), Role.STORE, env.DEFAULT_STORE_PORT
            )
        )
    elif job.rendezvous.managed_etcd:
        out.append(
            headless_service(
                job, labels.etcd_service_name(job.name), Role.ETCD, env.DEFAULT_ETCD_PORT
            )
        )
    return out
