"""Each rendezvous backend as the operator runs it, one module each, and their registry.
May import: ``render.rendezvous``, ``render.manifests``, ``model``; never one another."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from torchflex_contract.rendezvous_backends import RendezvousBackend
from torchflex_operator.model.spec import JobSpec
from torchflex_operator.render.backends import c10d, etcd
from torchflex_operator.render.backends.c10d import store_pod as store_pod
from torchflex_operator.render.backends.etcd import etcd_pod as etcd_pod
from torchflex_operator.render.rendezvous import Host as Host
from torchflex_operator.render.rendezvous import OperatorBackend as OperatorBackend

# Each rendezvous backend as the operator runs it: the pod and Service that hold
# a job's store, and the endpoint the agents are told.
#
# Where it sits: pure, like ``render.builders`` above it. ``builders`` writes
# ``endpoint(job)`` into the agents' env and adds the host's Service to the
# job's Services; the planner's ``steps.store.rendezvous_host`` keeps ``host(job)``'s
# pod alive. The names are the contract's ``RendezvousBackend`` (``SPEC_BACKENDS``,
# the ones a job spec may name); the agent's ``backends`` module is the other
# side of each name (how the agent parses the endpoint and connects).
#
# Like torch elastic's rendezvous registry, one entry per name and nothing
# else branches on it. Adding a backend is one module here (its ``BACKEND`` and
# the pod it runs, if any), its line below, the CRD's enum and their tests.
REGISTRY: Mapping[RendezvousBackend, OperatorBackend] = MappingProxyType(
    {b.name: b for b in (c10d.BACKEND, etcd.BACKEND)}
)


def host(job: JobSpec) -> Host | None:
    """The pod (and Service) the operator runs for ``job``'s rendezvous, if any."""
    return REGISTRY[job.rendezvous.backend].host(job)


def endpoint(job: JobSpec) -> str:
    """What the agents dial (``env.RDZV_ENDPOINT``): the host's Service, else the user's."""
    run = host(job)
    return run.endpoint(job.namespace) if run is not None else job.rendezvous.endpoint or ""
