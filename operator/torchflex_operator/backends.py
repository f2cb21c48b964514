"""Each rendezvous backend as the operator runs it: the pod and Service that hold
a job's store, and the endpoint the agents are told.

Where it sits: pure, like ``builders`` above it. ``builders`` writes
``endpoint(job)`` into the agents' env and adds the host's Service to the
job's Services; the planner's ``rendezvous_host`` keeps ``host(job)``'s pod
alive. The names are the contract's ``RendezvousBackend`` (``SPEC_BACKENDS``,
the ones a job spec may name); the agent's ``backends`` module is the other
side of each name (how the agent parses the endpoint and connects).

Like torch elastic's rendezvous registry, one entry per name and nothing
else branches on it. Adding a backend is one ``OperatorBackend`` below (and
the pod it runs, if any), the CRD's enum and their tests.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping

from torchflex_contract import env, labels
from torchflex_contract.labels import Role
from torchflex_contract.rendezvous_backends import RendezvousBackend
from torchflex_operator.manifests import Manifest, aux_pod, headless_service, trainer_container
from torchflex_operator.settings import Settings
from torchflex_operator.spec import JobSpec

STORE_REQUESTS = {"cpu": "100m", "memory": "512Mi"}
"""The store process imports torch for its TCPStore: a few hundred MiB resident."""

STORE_DNS: Manifest = {
    "dnsPolicy": "None",
    "dnsConfig": {
        "nameservers": ["127.0.0.1"],
        "options": [{"name": "attempts", "value": "1"}, {"name": "timeout", "value": "1"}],
    },
}
"""The store pod's resolver: loopback, where nothing answers, so a lookup fails at once.

torch's TCPStore server looks up every accepted peer's name (reverse DNS, for
its log) on its one event-loop thread: each agent's connect costs a cluster DNS
round trip, and a lost answer froze every agent's store calls for 5-10 s (seen
while 1,024 agents connected: past the calls' 2 s deadline, StoreLost). The
store resolves nothing else: it only listens. The options bound a lookup even if a node's DNS
interception answers slowly for 127.0.0.1."""


@dataclasses.dataclass(frozen=True)
class Host:
    """A pod the operator runs to hold one job's rendezvous state, behind a headless Service."""

    role: Role
    pod_name: str
    service_name: str
    port: int
    scheme: str
    """Written in front of the endpoint's ``host:port``: ``""`` or ``"http://"``."""
    build: Callable[[JobSpec, Settings], Manifest]
    """The pod's manifest."""

    def endpoint(self, namespace: str) -> str:
        """``<service>.<namespace>:<port>``: resolvable through the pod's DNS search path
        on any cluster domain (no hard-coded ``cluster.local``)."""
        return f"{self.scheme}{self.service_name}.{namespace}:{self.port}"

    def service(self, job: JobSpec) -> Manifest:
        return headless_service(job, self.service_name, self.role, self.port)


@dataclasses.dataclass(frozen=True)
class OperatorBackend:
    name: RendezvousBackend
    host: Callable[[JobSpec], Host | None]
    """The pod this job's rendezvous needs, or None: the agents dial the user's
    ``spec.rendezvous.endpoint`` and the operator runs nothing for it."""


def store_pod(job: JobSpec, settings: Settings) -> Manifest:
    trainer = trainer_container(dict(job.template.get("spec") or {}))
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
    pod = aux_pod(job, labels.store_pod_name(job.name), Role.STORE, container)
    pod["spec"].update(copy.deepcopy(STORE_DNS))
    return pod


def etcd_pod(job: JobSpec, settings: Settings) -> Manifest:
    name = labels.etcd_pod_name(job.name)
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
            _pod_host(Role.ETCD, job).endpoint(job.namespace),
            "--listen-peer-urls",
            "http://127.0.0.1:2380",
        ],
        "ports": [{"name": "client", "containerPort": env.DEFAULT_ETCD_PORT}],
    }
    return aux_pod(job, name, Role.ETCD, container)


_Name = Callable[[str], str]
_Build = Callable[[JobSpec, Settings], Manifest]
_POD_HOSTS: dict[Role, tuple[_Name, _Name, int, str, _Build]] = {
    # role: pod name, Service name (of the job's name), port, endpoint scheme, pod
    Role.STORE: (
        labels.store_pod_name,
        labels.store_service_name,
        env.DEFAULT_STORE_PORT,
        "",
        store_pod,
    ),
    Role.ETCD: (
        labels.etcd_pod_name,
        labels.etcd_service_name,
        env.DEFAULT_ETCD_PORT,
        "http://",
        etcd_pod,
    ),
}


def _pod_host(role: Role, job: JobSpec) -> Host:
    pod, service, port, scheme, build = _POD_HOSTS[role]
    return Host(role, pod(job.name), service(job.name), port, scheme, build)


def _store_pod_host(job: JobSpec) -> Host:
    return _pod_host(Role.STORE, job)


def _managed_etcd_host(job: JobSpec) -> Host | None:
    return _pod_host(Role.ETCD, job) if job.rendezvous.managed_etcd else None


_BACKENDS = (
    OperatorBackend(RendezvousBackend.C10D, _store_pod_host),
    OperatorBackend(RendezvousBackend.ETCD, _managed_etcd_host),
)
REGISTRY: Mapping[RendezvousBackend, OperatorBackend] = {b.name: b for b in _BACKENDS}


def host(job: JobSpec) -> Host | None:
    """The pod (and Service) the operator runs for ``job``'s rendezvous, if any."""
    return REGISTRY[job.rendezvous.backend].host(job)


def endpoint(job: JobSpec) -> str:
    """What the agents dial (``env.RDZV_ENDPOINT``): the host's Service, else the user's."""
    run = host(job)
    return run.endpoint(job.namespace) if run is not None else job.rendezvous.endpoint or ""
