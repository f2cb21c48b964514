"""The c10d backend: a TCPStore pod (``torchflex-agent store``) per job.

Where it sits: one entry of the ``render.backends`` registry; pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from torchflex_contract import env, labels
from torchflex_contract.labels import PodKind
from torchflex_contract.rendezvous_backends import RendezvousBackend
from torchflex_operator.model.settings import Settings
from torchflex_operator.model.spec import JobSpec
from torchflex_operator.render.manifests import Manifest, aux_pod, thaw, trainer_container
from torchflex_operator.render.rendezvous import Host, OperatorBackend

STORE_REQUESTS: Mapping[str, str] = MappingProxyType({"cpu": "100m", "memory": "512Mi"})
"""The store process imports torch for its TCPStore: a few hundred MiB resident."""

STORE_DNS: Mapping[str, Any] = MappingProxyType(
    {
        "dnsPolicy": "None",
        "dnsConfig": MappingProxyType(
            {
                "nameservers": ("127.0.0.1",),
                "options": (
                    MappingProxyType({"name": "attempts", "value": "1"}),
                    MappingProxyType({"name": "timeout", "value": "1"}),
                ),
            }
        ),
    }
)
"""The store pod's resolver: loopback, where nothing answers, so a lookup fails at once.

torch's TCPStore server looks up every accepted peer's name (reverse DNS, for
its log) on its one event-loop thread: each agent's connect costs a cluster DNS
round trip, and a lost answer froze every agent's store calls for 5-10 s (seen
while 1,024 agents connected: past the calls' 2 s deadline, StoreLost). The
store resolves nothing else: it only listens. The options bound a lookup even if a node's DNS
interception answers slowly for 127.0.0.1."""


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
    pod = aux_pod(job, labels.store_pod_name(job.name), PodKind.STORE, container)
    pod["spec"].update(thaw(STORE_DNS))
    return pod


def host(job: JobSpec) -> Host:
    """The store pod every c10d job runs, behind its headless Service."""
    return Host(
        PodKind.STORE,
        labels.store_pod_name(job.name),
        labels.store_service_name(job.name),
        env.DEFAULT_STORE_PORT,
        "",
        store_pod,
    )


BACKEND = OperatorBackend(RendezvousBackend.C10D, host)
