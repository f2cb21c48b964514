"""The etcd backend: the user's etcd, or (``managedEtcd``) one etcd pod per job.

Where it sits: one entry of the ``render.backends`` registry; pure.
"""

from __future__ import annotations

from torchflex_contract import env, labels
from torchflex_contract.labels import PodKind
from torchflex_contract.rendezvous_backends import RendezvousBackend
from torchflex_operator.model.settings import Settings
from torchflex_operator.model.spec import JobSpec
from torchflex_operator.render.manifests import Manifest, aux_pod
from torchflex_operator.render.rendezvous import Host, OperatorBackend


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
            pod_host(job).endpoint(job.namespace),
            "--listen-peer-urls",
            "http://127.0.0.1:2380",
        ],
        "ports": [{"name": "client", "containerPort": env.DEFAULT_ETCD_PORT}],
    }
    return aux_pod(job, name, PodKind.ETCD, container)


def pod_host(job: JobSpec) -> Host:
    """The etcd pod of a ``managedEtcd`` job, behind its headless Service."""
    return Host(
        PodKind.ETCD,
        labels.etcd_pod_name(job.name),
        labels.etcd_service_name(job.name),
        env.DEFAULT_ETCD_PORT,
        "http://",
        etcd_pod,
    )


def host(job: JobSpec) -> Host | None:
    """The managed etcd pod, or None: the agents dial the user's endpoint."""
    return pod_host(job) if job.rendezvous.managed_etcd else None


BACKEND = OperatorBackend(RendezvousBackend.ETCD, host)
