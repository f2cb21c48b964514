"""TorchX AppDef -> ElasticJob manifest, and ElasticJob status -> TorchX state. Pure.

Where it sits: under ``torchflex_torchx.scheduler`` (the part with the API
client), and tested alone by tables (tests/unit/torchx). A ``dist.ddp`` role
runs ``bash -c "torchrun <launcher flags> <script> <args>"``: the launcher
flags are torchrun's and the operator's agent takes their place, so only what
the job needs from them is kept (``--nproc_per_node``, ``--max_restarts``); the
rest (the rendezvous flags above all) is the operator's business. Any other
role's entrypoint and args become the container's command unchanged.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any, Final

from torchx import specs

from torchflex_contract import env as tf_env
from torchflex_contract import labels

# Kubernetes names: the operator derives ``<job>-worker-<i>``, ``<job>-store`` and
# Service names from the job's name, and a Service name is at most 63 characters.
MAX_JOB_NAME: Final = 40
_SUFFIX_LEN: Final = 6
APP_NAME_LABEL: Final = "torchx.pytorch.org/app-name"
CANCELLED_ANNOTATION: Final = "torchx.pytorch.org/cancelled"
GPU_RESOURCE: Final = "nvidia.com/gpu"


class TranslationError(ValueError):
    """An AppDef this scheduler cannot turn into an ElasticJob; says which field."""


class _Arity(enum.Enum):
    VALUE = "value"
    FLAG = "flag"


# torchrun's own options (torch.distributed.run), by how many tokens they take.
# Underscore and dash spellings are both accepted by torchrun; keys are normalised
# to underscores. An option not here is refused, never guessed at.
_VALUE_OPTIONS: Final = (
    "nnodes", "nproc_per_node", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "rdzv_conf",
    "max_restarts", "monitor_interval", "start_method", "role", "tee", "redirects",
    "log_dir", "logs_specs", "node_rank", "master_addr", "master_port", "local_addr",
    "local_ranks_filter", "event_log_handler", "numa_binding", "signals_to_handle",
)  # fmt: skip
_FLAG_OPTIONS: Final = ("standalone", "no_python", "module", "run_path", "virtual_local_rank")
_TORCHRUN_OPTIONS: Final[Mapping[str, _Arity]] = {
    **dict.fromkeys(_VALUE_OPTIONS, _Arity.VALUE),
    **dict.fromkeys(_FLAG_OPTIONS, _Arity.FLAG),
}


@dataclasses.dataclass(frozen=True)
class Launch:
    """What a role's command says about the job: its training command and the
    torchrun options the ElasticJob keeps."""

    command: tuple[str, ...]
    nproc_per_node: int = 1
    max_restarts: int | None = None


@dataclasses.dataclass(frozen=True)
class Options:
    """The scheduler's run options (``torchx runopts torchflex``), already checked."""

    namespace: str = "default"
    service_account: str | None = None
    node_selector: tuple[tuple[str, str], ...] = ()
    working_dir: str | None = None


def parse_node_selector(text: str | None) -> tuple[tuple[str, str], ...]:
    """``"k=v,k2=v2"`` -> pairs; the run option ``node_selector``."""
    if not text:
        return ()
    pairs = []
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise TranslationError(f"node_selector: {item!r} is not key=value")
        pairs.append((key.strip(), value.strip()))
    return tuple(pairs)


def _option(token: str) -> tuple[str, str | None]:
    """``--nproc-per-node=2`` -> (``nproc_per_node``, ``"2"``)."""
    name, sep, value = token.lstrip("-").partition("=")
    return name.replace("-", "_"), (value if sep else None)


def _int_option(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise TranslationError(f"torchrun --{name}: {value!r} is not an integer") from None


def parse_torchrun(argv: Sequence[str]) -> Launch:
    """``torchrun <options> <script|-m module> <args>`` -> the training command.

    ``argv`` starts after the word ``torchrun``.
    """
    values: dict[str, str] = {}
    flags: set[str] = set()
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        name, inline = _option(argv[i])
        if name == "m":
            name = "module"
        arity = _TORCHRUN_OPTIONS.get(name)
        if arity is None:
            raise TranslationError(f"torchrun option {argv[i]!r} is not one torchrun has")
        if arity is _Arity.FLAG:
            flags.add(name)
            i += 1
            continue
        if inline is None:
            if i + 1 >= len(argv):
                raise TranslationError(f"torchrun option {argv[i]!r} has no value")
            inline = argv[i + 1]
            i += 1
        values[name] = inline
        i += 1
    rest = tuple(argv[i:])
    if not rest:
        raise TranslationError("torchrun: no training script or module after its options")
    if "no_python" in flags:
        command = rest
    elif "module" in flags:
        command = ("python", "-m", *rest)
    else:
        command = ("python", *rest)
    nproc = values.get("nproc_per_node", "1")
    if not nproc.isdigit() or int(nproc) < 1:
        # "gpu"/"auto" depend on the node; the ElasticJob wants a number.
        raise TranslationError(f"torchrun --nproc_per_node: {nproc!r} must be a positive integer")
    restarts = values.get("max_restarts")
    return Launch(
        command=command,
        nproc_per_node=int(nproc),
        max_restarts=None if restarts is None else _int_option("max_restarts", restarts),
    )


def role_launch(role: specs.Role) -> Launch:
    """The training command of a role: torchrun's options dropped, anything else kept."""
    entrypoint: str = role.entrypoint
    args = [str(a) for a in role.args]
    if entrypoint == "torchrun":
        return parse_torchrun(args)
    if entrypoint in ("bash", "sh", "/bin/bash", "/bin/sh") and args[:1] == ["-c"]:
        words = shlex.split(args[1]) if len(args) > 1 else []
        if words[:1] == ["torchrun"]:
            return parse_torchrun(words[1:])
    return Launch(command=(entrypoint, *args))


def base_name(app_name: str) -> str:
    """The app's name as the start of a DNS-1123 name (also the app-name label's value)."""
    room = MAX_JOB_NAME - _SUFFIX_LEN - 1
    base = re.sub(r"[^a-z0-9-]+", "-", app_name.lower()).strip("-") or "app"
    if not base[0].isalpha():
        base = f"app-{base}"
    return base[:room].rstrip("-")


def job_name(app_name: str, suffix: str) -> str:
    """A unique job name: the app's name and a suffix (``train-x7k2p9``)."""
    if not re.fullmatch(r"[a-z0-9]+", suffix):
        raise TranslationError(f"job name suffix {suffix!r} is not lowercase alphanumeric")
    return f"{base_name(app_name)}-{suffix[:_SUFFIX_LEN]}"


def _resources(resource: specs.Resource) -> dict[str, Any]:
    if resource == specs.NULL_RESOURCE:
        return {}
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if resource.cpu > 0:
        requests["cpu"] = str(resource.cpu)
    if resource.memMB > 0:
        requests["memory"] = f"{resource.memMB}Mi"
    if resource.gpu > 0:
        # Extended resources: a limit, and the request equals it.
        limits[GPU_RESOURCE] = requests[GPU_RESOURCE] = str(resource.gpu)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _volumes(mounts: Sequence[object]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes: list[dict[str, Any]] = []
    volume_mounts: list[dict[str, Any]] = []
    for i, mount in enumerate(mounts):
        name = f"mount-{i}"
        if isinstance(mount, specs.BindMount):
            volumes.append({"name": name, "hostPath": {"path": mount.src_path}})
            target, read_only = mount.dst_path, mount.read_only
        elif isinstance(mount, specs.VolumeMount):
            volumes.append({"name": name, "persistentVolumeClaim": {"claimName": mount.src}})
            target, read_only = mount.dst_path, mount.read_only
        else:
            raise TranslationError(
                f"mounts[{i}]: {type(mount).__name__} is not supported (bind and volume are)"
            )
        volume_mounts.append({"name": name, "mountPath": target, "readOnly": read_only})
    return volumes, volume_mounts


def _macro_values(namespace: str, name: str) -> specs.macros.Values:
    # A worker's index is only known in the pod: the env var the operator sets there
    # (Kubernetes expands $(VAR) in command and args).
    return specs.macros.Values(
        img_root="",
        app_id=app_id(namespace, name),
        replica_id=f"$({tf_env.REPLICA_INDEX})",
        rank0_env="MASTER_ADDR",
    )


def elastic_job(app: specs.AppDef, name: str, options: Options) -> dict[str, Any]:
    """The ElasticJob for a one-role app: min..max pods from the role's replicas."""
    if len(app.roles) != 1:
        raise TranslationError(
            f"roles: an ElasticJob has one worker role; the app has {len(app.roles)}"
        )
    role = _macro_values(options.namespace, name).apply(app.roles[0])
    maximum = int(role.num_replicas)
    minimum = maximum if role.min_replicas is None else int(role.min_replicas)
    if not 1 <= minimum <= maximum:
        raise TranslationError(
            f"role {role.name!r}: min_replicas {minimum} must be between 1 and"
            f" num_replicas {maximum}"
        )
    if role.max_retries < 0:
        raise TranslationError(f"role {role.name!r}: max_retries {role.max_retries} < 0")
    launch = role_launch(role)
    volumes, volume_mounts = _volumes(role.mounts)
    container: dict[str, Any] = {
        "name": labels.TRAINER_CONTAINER,
        "image": role.image,
        "command": list(launch.command),
        "env": [{"name": k, "value": str(v)} for k, v in sorted(role.env.items())],
    }
    if options.working_dir:
        container["workingDir"] = options.working_dir
    if resources := _resources(role.resource):
        container["resources"] = resources
    if volume_mounts:
        container["volumeMounts"] = volume_mounts
    pod: dict[str, Any] = {"containers": [container]}
    if volumes:
        pod["volumes"] = volumes
    if options.service_account:
        pod["serviceAccountName"] = options.service_account
    if options.node_selector:
        pod["nodeSelector"] = dict(options.node_selector)
    spec: dict[str, Any] = {
        "minReplicas": minimum,
        "maxReplicas": maximum,
        "nprocPerNode": launch.nproc_per_node,
        # TorchX's "scheduler retries" are the pod failures a job survives.
        "backoffLimit": role.max_retries,
        "template": {"spec": pod},
    }
    if launch.max_restarts is not None:
        spec["maxRestarts"] = launch.max_restarts
    return {
        "apiVersion": labels.API_VERSION,
        "kind": labels.KIND,
        "metadata": {
            "name": name,
            "namespace": options.namespace,
            "labels": {APP_NAME_LABEL: base_name(app.name)},
            "annotations": {ROLE_ANNOTATION: role.name},
        },
        "spec": spec,
    }


# ElasticJob ``status.phase`` -> TorchX state. Restarting is a running job that lost
# pods (TorchX has no word for it); Suspended waits for its resumption like Pending.
PHASE_STATES: Final[Mapping[str, specs.AppState]] = {
    "Pending": specs.AppState.PENDING,
    "Running": specs.AppState.RUNNING,
    "Restarting": specs.AppState.RUNNING,
    "Suspended": specs.AppState.PENDING,
    "Succeeded": specs.AppState.SUCCEEDED,
    "Failed": specs.AppState.FAILED,
}


def app_state(job: Mapping[str, Any]) -> specs.AppState:
    """The TorchX state of an ElasticJob object as read from the API."""
    annotations = (job.get("metadata") or {}).get("annotations") or {}
    phase = str((job.get("status") or {}).get("phase") or "")
    if phase in ("Succeeded", "Failed"):
        return PHASE_STATES[phase]
    if annotations.get(CANCELLED_ANNOTATION) == "true":
        return specs.AppState.CANCELLED
    if not phase:
        return specs.AppState.SUBMITTED
    if phase not in PHASE_STATES:
        return specs.AppState.UNKNOWN
    return PHASE_STATES[phase]


def app_id(namespace: str, name: str) -> str:
    return f"{namespace}:{name}"


def parse_app_id(text: str) -> tuple[str, str]:
    """``<namespace>:<name>`` -> (namespace, name)."""
    namespace, sep, name = text.partition(":")
    if not sep or not namespace or not name or ":" in name:
        raise TranslationError(f"app id {text!r} is not <namespace>:<name>")
    return namespace, name


ROLE_ANNOTATION: Final = "torchx.pytorch.org/role-name"

# Pod ``status.phase`` -> the state of one TorchX replica.
POD_STATES: Final[Mapping[str, specs.AppState]] = {
    "Pending": specs.AppState.PENDING,
    "Running": specs.AppState.RUNNING,
    "Succeeded": specs.AppState.SUCCEEDED,
    "Failed": specs.AppState.FAILED,
}


def pod_state(pod_phase: str | None) -> specs.AppState:
    return POD_STATES.get(pod_phase or "", specs.AppState.UNKNOWN)


def status_message(job: Mapping[str, Any]) -> str:
    """One line on where the job is: its phase, and a failure's or cancellation's why."""
    status = job.get("status") or {}
    phase = str(status.get("phase") or "Submitted")
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Failed" and condition.get("status") == "True":
            return f"{phase}: {condition.get('message', '')}".rstrip(": ")
    return phase
