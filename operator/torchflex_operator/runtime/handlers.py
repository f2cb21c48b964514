"""kopf wiring: watch events feed the caches and wake the job's reconcile.

Where it sits: the only module importing kopf's decorators. ``register``
builds a fresh ``kopf.OperatorRegistry`` around one ``Reconciler`` (no
module globals, so a test can run the operator twice in one process).
Every handler is an ``on.event`` handler that only records state and
enqueues the owning job: no field-triggered logic, no finalizers, no kopf
annotations on our objects; all decisions happen in one reconcile per job.
kopf runs standalone on every replica (no kopf peering): these handlers write
nothing to the API, so on a standby they only keep the caches warm, and the
reconcile workers wait on the ``leader`` gate.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Any

import kopf

from torchflex_contract import labels
from torchflex_operator.runtime.reconcile import Reconciler

log = logging.getLogger(__name__)
_OWNED = {labels.Label.MANAGED_BY.value: labels.MANAGED_BY_VALUE}


def in_cluster_server(info: kopf.ConnectionInfo, environ: Mapping[str, str]) -> kopf.ConnectionInfo:
    """Point kopf's service-account login at $KUBERNETES_SERVICE_HOST:PORT.

    kopf assumes https://kubernetes.default.svc, which needs cluster DNS; the
    kubelet's env vars are what client-go (and our ``kube.load_api_client``) use,
    so both of the operator's clients reach the same API server.
    """
    host = environ.get("KUBERNETES_SERVICE_HOST")
    port = environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return info
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    return dataclasses.replace(info, server=f"https://{host}:{port}")


def register(reconciler: Reconciler, *, watch_nodes: bool = True) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # A custom registry has no default login handlers. Both of these read the
        # environment at call time (the client library's loader caches $KUBECONFIG
        # at import), so an in-process test can point us at its cluster.
        info: kopf.ConnectionInfo | None = kopf.login_with_service_account(**kwargs)
        if info is None:
            return kopf.login_with_kubeconfig(**kwargs)
        return in_cluster_server(info, os.environ)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        # Decisions are reported as our own Events; kopf's handler chatter is noise.
        settings.posting.enabled = False
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        reconciler.start()

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        await reconciler.stop()

    @kopf.on.event(labels.GROUP, labels.VERSION, labels.PLURAL, registry=registry)
    async def job_event(
        type: str, name: str, namespace: str | None, body: kopf.Body, **_: Any
    ) -> None:
        key = (namespace or "", name)
        if type == "DELETED":
            reconciler.forget(key)
        else:
            reconciler.job_seen(key, dict(body))

    @kopf.on.event("", "v1", "pods", labels=_OWNED, registry=registry)
    async def pod_event(type: str, body: kopf.Body, **_: Any) -> None:
        key = reconciler.cache.update_pod(type, dict(body))
        if key is not None:
            reconciler.enqueue(key)

    @kopf.on.event("", "v1", "services", labels=_OWNED, registry=registry)
    async def service_event(type: str, body: kopf.Body, **_: Any) -> None:
        key = reconciler.cache.update_service(type, dict(body))
        if key is not None:
            reconciler.enqueue(key)

    @kopf.on.event("networking.k8s.io", "v1", "networkpolicies", labels=_OWNED, registry=registry)
    async def network_policy_event(type: str, body: kopf.Body, **_: Any) -> None:
        key = reconciler.cache.update_network_policy(type, dict(body))
        if key is not None:
            reconciler.enqueue(key)

    # Kueue's Workloads of queued jobs (``render.workload``). Where Kueue is not installed
    # kopf says the resource is unresolved; a queued job also re-reads its Workload
    # (``render.workload.must_read``), so a watch that never started only slows Kueue's word.
    @kopf.on.event("kueue.x-k8s.io", "v1beta2", "workloads", labels=_OWNED, registry=registry)
    async def workload_event(type: str, body: kopf.Body, **_: Any) -> None:
        key = reconciler.workloads.seen(type, dict(body))
        if key is not None:
            reconciler.enqueue(key)

    if watch_nodes:

        @kopf.on.event("", "v1", "nodes", registry=registry)
        async def node_event(type: str, body: kopf.Body, **_: Any) -> None:
            name, changed = reconciler.nodes.update(type, dict(body))
            if changed:
                for key in reconciler.cache.jobs_on_node(name):
                    reconciler.enqueue(key)

    return registry
