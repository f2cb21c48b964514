"""The shape of a rendezvous backend as the operator runs it: ``Host`` (the pod and
headless Service that hold a job's store) and ``OperatorBackend`` (one registry entry).

Where it sits: pure, in ``render``; each module of ``render.backends`` builds one
backend's ``Host`` and pod, and ``render.backends`` (the registry) names them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from torchflex_contract.labels import PodKind
from torchflex_contract.rendezvous_backends import RendezvousBackend
from torchflex_operator.model.settings import Settings
from torchflex_operator.model.spec import JobSpec
from torchflex_operator.render.manifests import Manifest, headless_service


@dataclasses.dataclass(frozen=True)
class Host:
    """A pod the operator runs to hold one job's rendezvous state, behind a headless Service."""

    role: PodKind
    """The host pod's kind (its ``torchflex.io/role`` label)."""
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
