"""Typed, defaulted view of an ElasticJob's ``spec``.

Where it sits: the pure layer's entry point. ``JobSpec.parse`` turns the raw
object (a dict from the API) into frozen dataclasses the planner and pod
builders read; the CRD schema applies the same defaults server-side, these
are the fallbacks for objects created before a default existed (the
agent's defaults in ``torchflex_contract.env`` are the job's; tests/unit/
test_defaults.py fails when the CRD, these and the agent's differ). The
``status`` has its own typed value (``status.JobStatus``).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from torchflex_contract import env, labels
from torchflex_contract.rendezvous_backends import DEFAULT_BACKEND, SPEC_BACKENDS, RendezvousBackend
from torchflex_contract.roles import Coupling, RoleSize
from torchflex_operator.model.errors import InvalidSpecError
from torchflex_operator.model.roles import FailureScope, RoleSpec, check_role_refs, parse_roles
from torchflex_operator.model.vocabulary import KueueLabel

DEFAULT_BACKOFF_LIMIT = 6
DEFAULT_MAX_RESTARTS = env.DEFAULT_MAX_RESTARTS
DEFAULT_MIN_AVAILABLE_TIMEOUT_S = 600
DEFAULT_JOIN_TIMEOUT_S = int(env.DEFAULT_JOIN_TIMEOUT_S)
DEFAULT_LAST_CALL_S = env.DEFAULT_LAST_CALL_S
DEFAULT_SHM_SIZE_LIMIT = "1Gi"
MIN_HANG_TIMEOUT_S = env.MIN_HANG_TIMEOUT_S
MAX_HANG_TIMEOUT_S = env.MAX_HANG_TIMEOUT_S


class CleanPodPolicy(enum.StrEnum):
    ALL = "All"
    RUNNING = "Running"
    NONE = "None"


class StragglerPolicy(enum.StrEnum):
    """``spec.stragglerPolicy``: what the operator does about a straggler its agents name."""

    IGNORE = "Ignore"
    """Name it in status and an Event only."""
    REPLACE = "Replace"
    """Also delete its pod (the group re-forms without it) and keep the job's pods off its
    node from then on (``status.avoidedNodes``), while the job keeps above its minimum."""


@dataclasses.dataclass(frozen=True)
class Rendezvous:
    backend: RendezvousBackend = DEFAULT_BACKEND
    endpoint: str | None = None
    tls_secret_name: str | None = None
    join_timeout_s: int = DEFAULT_JOIN_TIMEOUT_S
    last_call_s: float = DEFAULT_LAST_CALL_S
    managed_etcd: bool = False


@dataclasses.dataclass(frozen=True)
class SharedMemory:
    """``spec.sharedMemory``: the memory-backed ``/dev/shm`` of the trainer container."""

    enabled: bool = True
    size_limit: str = DEFAULT_SHM_SIZE_LIMIT


@dataclasses.dataclass(frozen=True)
class JobSpec:
    name: str
    namespace: str
    uid: str
    min_replicas: int
    max_replicas: int
    replicas: int | None
    nproc_per_node: str
    rendezvous: Rendezvous
    max_restarts: int
    backoff_limit: int
    min_available_timeout_s: int
    template: Mapping[str, Any]
    suspend: bool = False
    ttl_seconds_after_finished: int | None = None
    active_deadline_s: int | None = None
    clean_pod_policy: CleanPodPolicy = CleanPodPolicy.RUNNING
    generation: int = 0
    deleting: bool = False
    network_policy: bool = True
    """``spec.networkPolicy.enabled``: the operator keeps a NetworkPolicy isolating the job."""
    shared_memory: SharedMemory = SharedMemory()
    queue_name: str | None = None
    """Kueue's LocalQueue (label ``kueue.x-k8s.io/queue-name``): it gates the job
    (``render.workload``)."""
    priority_class: str | None = None
    """Kueue's WorkloadPriorityClass (label ``kueue.x-k8s.io/priority-class``)."""
    warm_spares: int = 0
    """``spec.warmSpares``: prewarmed pods kept beyond ``desired`` to scale up fast
    (``planning.steps.spares``)."""
    straggler_policy: StragglerPolicy = StragglerPolicy.IGNORE
    node_check: bool = False
    """``spec.nodeCheck.enabled``: each agent checks its node before joining."""
    hang_timeout_s: int | None = None
    """``spec.hangTimeoutSeconds``: seconds without progress before the agents declare
    a hang (0: off); None: the agents derive it from the job's step time."""
    roles: tuple[RoleSpec, ...] = ()
    """``spec.roles``: a multi-role job's roles in spec order; empty for a job of one
    worker group (``WORKER_ROLE``), whose fields are the top-level ones. For a multi-role
    job the top-level ``min_replicas``/``max_replicas`` are the sums of the roles' and
    ``template``/``nproc_per_node`` the first role's (the store pod is placed like it);
    ``role_view`` gives one role as a job of one group."""
    coupling: Coupling = Coupling.INDEPENDENT
    scale_role: str | None = None
    """``spec.scaleRole`` (multi-role only): the role ``spec.replicas`` drives; the first
    role when absent (``scale_role_name``)."""
    completion_role: str | None = None
    """``spec.completionRole`` (multi-role only): the role whose completion completes the
    job; the first role when absent (``completion_role_name``)."""
    role: str = labels.WORKER_ROLE
    """The training role this value describes: ``WORKER_ROLE`` for a single-role job and
    for the whole of a multi-role job, a role's name in a ``role_view``."""

    @property
    def multi_role(self) -> bool:
        return bool(self.roles)

    @property
    def keeps_spares(self) -> bool:
        """Whether the job asks for warm spares (``spec.warmSpares``, or a role's)."""
        return bool(self.warm_spares) or any(r.warm_spares for r in self.roles)

    @property
    def joint(self) -> bool:
        """A multi-role job whose roles form one group (``coupling: Joint``)."""
        return bool(self.roles) and self.coupling is Coupling.JOINT

    @property
    def job_scoped_roles(self) -> tuple[str, ...]:
        """Roles of an Independent job with ``failureScope: Job`` (a Joint job re-forms
        every role on any failure already: none)."""
        if self.joint:
            return ()
        return tuple(r.name for r in self.roles if r.failure_scope is FailureScope.JOB)

    @property
    def scale_role_name(self) -> str:
        """The role ``spec.replicas`` (``kubectl scale``, HPA) drives."""
        if not self.roles:
            return labels.WORKER_ROLE
        return self.scale_role or self.roles[0].name

    @property
    def completion_role_name(self) -> str:
        """The role whose final round exiting 0 completes the job."""
        if not self.roles:
            return labels.WORKER_ROLE
        return self.completion_role or self.roles[0].name

    @property
    def role_sizes(self) -> tuple[RoleSize, ...]:
        """Every role's range in spec order (what ``env.ROLE_SIZES`` carries)."""
        return tuple(RoleSize(r.name, r.min_replicas, r.max_replicas) for r in self.roles)

    def admitted(self, count: int, role_counts: Mapping[str, int]) -> JobSpec:
        """The job run at what Kueue admitted: ``count`` workers, or for a multi-role job
        each role at most its own count (``role_counts``; a role absent: unchanged).
        Never more than the job asks for: an admission only lowers desired counts."""
        if not self.roles:
            return dataclasses.replace(self, replicas=min(self.desired, count))
        roles = tuple(
            dataclasses.replace(
                r,
                replicas=min(
                    self.role_view(r.name).desired, role_counts.get(r.name, r.max_replicas)
                ),
            )
            for r in self.roles
        )
        scale = self.scale_role_name
        replicas = self.replicas
        if replicas is not None and scale in role_counts:
            replicas = min(self.role_view(scale).desired, role_counts[scale])
        return dataclasses.replace(self, roles=roles, replicas=replicas)

    def role_view(self, name: str) -> JobSpec:
        """Role ``name`` of a multi-role job as a job of one group: its template, range,
        nprocPerNode and desired count (``spec.replicas`` for the scale role, else the
        role's own ``replicas``, else its ``maxReplicas``); ``roles`` stays, so the pod
        builder can write every role's range."""
        spec = next((r for r in self.roles if r.name == name), None)
        if spec is None:
            raise KeyError(f"no role {name!r} in spec.roles")
        scaled = name == self.scale_role_name and self.replicas is not None
        replicas = self.replicas if scaled else spec.replicas
        return dataclasses.replace(
            self,
            role=name,
            min_replicas=spec.min_replicas,
            max_replicas=spec.max_replicas,
            replicas=replicas,
            nproc_per_node=spec.nproc_per_node,
            template=spec.template,
            warm_spares=spec.warm_spares,
        )

    def role_views(self) -> tuple[JobSpec, ...]:
        """Each worker group of the job as a job of one group, in spec order: the job
        itself when it has no ``spec.roles``."""
        if not self.roles:
            return (self,)
        return tuple(self.role_view(r.name) for r in self.roles)

    @property
    def desired(self) -> int:
        """``spec.replicas`` clamped to ``[min, max]``; absent means ``max``. The whole of
        a multi-role job: the sum of its roles' (``role_view``)."""
        if self.roles and self.role == labels.WORKER_ROLE:
            return sum(view.desired for view in self.role_views())
        wanted = self.max_replicas if self.replicas is None else self.replicas
        return max(self.min_replicas, min(self.max_replicas, wanted))

    @property
    def rdzv_id(self) -> str:
        """Unique per job incarnation: a re-created job never joins old state."""
        return f"{self.namespace}-{self.name}-{self.uid[:8]}"

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> JobSpec:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        try:
            roles, min_r, max_r, template, nproc = _groups(spec)
            replicas = spec.get("replicas")
            rdzv_raw = spec.get("rendezvous") or {}
            backend = rdzv_raw.get("backend", DEFAULT_BACKEND)
            # The contract also names "memory", the agent's in-process test store:
            # no job may ask for it. (The message is the one the old enum gave.)
            if backend not in SPEC_BACKENDS:
                raise ValueError(f"{backend!r} is not a valid Backend")
            rdzv = Rendezvous(
                backend=RendezvousBackend(backend),
                endpoint=rdzv_raw.get("endpoint"),
                tls_secret_name=rdzv_raw.get("tlsSecretName"),
                join_timeout_s=int(rdzv_raw.get("joinTimeoutSeconds", DEFAULT_JOIN_TIMEOUT_S)),
                last_call_s=float(rdzv_raw.get("lastCallSeconds", DEFAULT_LAST_CALL_S)),
                managed_etcd=bool(rdzv_raw.get("managedEtcd", False)),
            )
            ttl = spec.get("ttlSecondsAfterFinished")
            deadline = spec.get("activeDeadlineSeconds")
            shm_raw = spec.get("sharedMemory") or {}
            hang = spec.get("hangTimeoutSeconds")
            job = cls(
                name=str(meta["name"]),
                namespace=str(meta.get("namespace", "default")),
                uid=str(meta.get("uid", "")),
                min_replicas=min_r,
                max_replicas=max_r,
                replicas=None if replicas is None else int(replicas),
                nproc_per_node=nproc,
                rendezvous=rdzv,
                max_restarts=int(spec.get("maxRestarts", DEFAULT_MAX_RESTARTS)),
                backoff_limit=int(spec.get("backoffLimit", DEFAULT_BACKOFF_LIMIT)),
                min_available_timeout_s=int(
                    spec.get("minAvailableTimeoutSeconds", DEFAULT_MIN_AVAILABLE_TIMEOUT_S)
                ),
                template=template,
                suspend=bool(spec.get("suspend", False)),
                ttl_seconds_after_finished=None if ttl is None else int(ttl),
                active_deadline_s=None if deadline is None else int(deadline),
                clean_pod_policy=CleanPodPolicy(spec.get("cleanPodPolicy", CleanPodPolicy.RUNNING)),
                generation=int(meta.get("generation", 0)),
                deleting=bool(meta.get("deletionTimestamp")),
                network_policy=bool((spec.get("networkPolicy") or {}).get("enabled", True)),
                shared_memory=SharedMemory(
                    enabled=bool(shm_raw.get("enabled", True)),
                    size_limit=str(shm_raw.get("sizeLimit", DEFAULT_SHM_SIZE_LIMIT)),
                ),
                queue_name=(meta.get("labels") or {}).get(KueueLabel.QUEUE_NAME) or None,
                priority_class=(meta.get("labels") or {}).get(KueueLabel.PRIORITY_CLASS) or None,
                warm_spares=int(spec.get("warmSpares", 0)),
                hang_timeout_s=None if hang is None else int(hang),
                straggler_policy=StragglerPolicy(spec.get("stragglerPolicy", "Ignore")),
                node_check=bool((spec.get("nodeCheck") or {}).get("enabled", False)),
                roles=roles,
                coupling=Coupling(spec.get("coupling", Coupling.INDEPENDENT)),
                scale_role=spec.get("scaleRole"),
                completion_role=spec.get("completionRole"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidSpecError(f"invalid ElasticJob spec: {exc}") from exc
        if job.roles:
            check_role_refs(
                job.roles,
                scale_role=job.scale_role,
                completion_role=job.completion_role,
                queued=job.queue_name is not None,
                joint=job.coupling is Coupling.JOINT,
            )
            if job.warm_spares:
                raise InvalidSpecError(
                    "spec.warmSpares is not read with spec.roles: set spec.roles[].warmSpares "
                    "per role"
                )
        elif job.scale_role or job.completion_role or "coupling" in spec:
            raise InvalidSpecError(
                "spec.coupling, spec.scaleRole and spec.completionRole need spec.roles"
            )
        if job.min_replicas < 1 or job.max_replicas < job.min_replicas:
            raise InvalidSpecError("need 1 <= spec.minReplicas <= spec.maxReplicas")
        if job.warm_spares < 0:
            raise InvalidSpecError("spec.warmSpares must be >= 0")
        hang = job.hang_timeout_s
        if hang is not None and not (hang == 0 or MIN_HANG_TIMEOUT_S <= hang <= MAX_HANG_TIMEOUT_S):
            raise InvalidSpecError(
                "spec.hangTimeoutSeconds must be 0 (off) or between "
                f"{MIN_HANG_TIMEOUT_S} and {MAX_HANG_TIMEOUT_S} seconds"
            )
        if job.rendezvous.backend is RendezvousBackend.ETCD and not (
            job.rendezvous.endpoint or job.rendezvous.managed_etcd
        ):
            raise InvalidSpecError("spec.rendezvous.endpoint is required for backend etcd")
        return job


def _groups(
    spec: Mapping[str, Any],
) -> tuple[tuple[RoleSpec, ...], int, int, Mapping[str, Any], str]:
    """(roles, minReplicas, maxReplicas, template, nprocPerNode) of ``JobSpec``: the
    top-level fields of a job of one group; with ``spec.roles``, the roles' ranges summed
    and the first role's template and process count."""
    if "roles" not in spec:
        min_r = int(spec.get("minReplicas", 1))
        max_r = int(spec.get("maxReplicas", min_r))
        return (), min_r, max_r, spec.get("template") or {}, str(spec.get("nprocPerNode", "auto"))
    roles = parse_roles(spec["roles"])
    if any(k in spec for k in ("template", "minReplicas", "maxReplicas")):
        raise InvalidSpecError(
            "spec.roles is mutually exclusive with spec.template, "
            "spec.minReplicas and spec.maxReplicas"
        )
    min_r = sum(r.min_replicas for r in roles)
    max_r = sum(r.max_replicas for r in roles)
    return roles, min_r, max_r, roles[0].template, roles[0].nproc_per_node
