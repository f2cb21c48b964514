"""``Kube``: every call the operator makes to the Kubernetes API.

Where it sits: the face of the ``kube`` package, the only place that talks to the
Kubernetes API (besides kopf's own watches). The reconciler and the apply layer call
its async methods: the ElasticJob and its status, pods, Services, NetworkPolicies,
Events and the leader-election Lease here, the optional scheduling APIs in
``scheduling.py``, the call wrapper and typed errors in ``transport.py``. Creates are
idempotent (409 = already there), deletes carry a UID precondition (so a delete never
hits a same-named replacement), status writes carry the resourceVersion they were
planned from (409 = re-read and re-plan).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from kubernetes import client

from torchflex_contract import labels
from torchflex_operator.kube.scheduling import SchedulingCalls
from torchflex_operator.kube.transport import COMPONENT, MERGE_PATCH, TIMEOUT_S, as_refusal
from torchflex_operator.model.errors import ConflictError, PermanentError
from torchflex_operator.model.timestamps import format_time


class Kube(SchedulingCalls):
    """The operator's API calls (``transport.KubeBase`` holds the clients)."""

    # -- ElasticJob ------------------------------------------------------------

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._get_or_none(
            f"get elasticjob {namespace}/{name}",
            lambda: self.custom.get_namespaced_custom_object(
                labels.GROUP, labels.VERSION, namespace, labels.PLURAL, name,
                _request_timeout=TIMEOUT_S,
            ),
        )  # fmt: skip

    async def patch_job_status(
        self, namespace: str, name: str, resource_version: str, patch: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Merge-patch the status, guarded by ``resource_version``; returns the new object."""
        body = {"metadata": {"resourceVersion": resource_version}, "status": dict(patch)}
        obj: Any = await self._call(
            f"patch elasticjob {namespace}/{name} status",
            lambda: self.custom.patch_namespaced_custom_object_status(
                labels.GROUP,
                labels.VERSION,
                namespace,
                labels.PLURAL,
                name,
                body,
                _request_timeout=TIMEOUT_S,
            ),
        )
        return dict(obj)

    async def patch_job(
        self, namespace: str, name: str, resource_version: str, patch: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Merge-patch the job itself (not its status), guarded by ``resource_version``."""
        meta = {**patch.get("metadata", {}), "resourceVersion": resource_version}
        body = {**patch, "metadata": meta}
        obj: Any = await self._call(
            f"patch elasticjob {namespace}/{name}",
            lambda: self.custom.patch_namespaced_custom_object(
                labels.GROUP,
                labels.VERSION,
                namespace,
                labels.PLURAL,
                name,
                body,
                _request_timeout=TIMEOUT_S,
            ),
        )
        return dict(obj)

    async def delete_job(self, namespace: str, name: str, uid: str) -> None:
        body: Any = {"propagationPolicy": "Background", "preconditions": {"uid": uid}}
        await self._ignore(
            (404, 409),
            f"delete elasticjob {namespace}/{name}",
            lambda: self.custom.delete_namespaced_custom_object(
                labels.GROUP,
                labels.VERSION,
                namespace,
                labels.PLURAL,
                name,
                body=body,
                _request_timeout=TIMEOUT_S,
            ),
        )

    # -- pods and services --------------------------------------------------------

    async def create_pod(self, manifest: Mapping[str, Any]) -> str | None:
        """Create a pod; returns its UID, or None when it already exists (409)."""
        ns = manifest["metadata"]["namespace"]
        name = manifest["metadata"]["name"]
        body: Any = dict(manifest)
        try:
            created = await self._call(
                f"create pod {ns}/{name}",
                lambda: self.core.create_namespaced_pod(ns, body, _request_timeout=TIMEOUT_S),
            )
        except ConflictError:
            return None
        except PermanentError as exc:
            raise as_refusal(exc) from exc.__cause__
        meta: Any = created.metadata
        return str(meta.uid)

    async def create_service(self, manifest: Mapping[str, Any]) -> bool:
        ns = manifest["metadata"]["namespace"]
        name = manifest["metadata"]["name"]
        body: Any = dict(manifest)
        try:
            return await self._ignore(
                (409,),
                f"create service {ns}/{name}",
                lambda: self.core.create_namespaced_service(ns, body, _request_timeout=TIMEOUT_S),
            )
        except PermanentError as exc:
            raise as_refusal(exc) from exc.__cause__

    async def create_network_policy(self, manifest: Mapping[str, Any]) -> bool:
        ns = manifest["metadata"]["namespace"]
        name = manifest["metadata"]["name"]
        body: Any = dict(manifest)
        return await self._ignore(
            (409,),
            f"create networkpolicy {ns}/{name}",
            lambda: self.networking.create_namespaced_network_policy(
                ns, body, _request_timeout=TIMEOUT_S
            ),
        )

    async def delete_network_policy(self, namespace: str, name: str) -> bool:
        return await self._ignore(
            (404,),
            f"delete networkpolicy {namespace}/{name}",
            lambda: self.networking.delete_namespaced_network_policy(
                name, namespace, _request_timeout=TIMEOUT_S
            ),
        )

    async def delete_pod(
        self, namespace: str, name: str, uid: str, *, force: bool, grace_s: int | None = None
    ) -> bool:
        """Delete exactly the pod with ``uid`` (gracefully unless ``force``; ``grace_s``
        shortens the pod's own grace period)."""
        opts = client.V1DeleteOptions(
            preconditions=client.V1Preconditions(uid=uid),
            grace_period_seconds=0 if force else grace_s,
        )
        return await self._ignore(
            (404, 409),
            f"delete pod {namespace}/{name}",
            lambda: self.core.delete_namespaced_pod(
                name, namespace, body=opts, _request_timeout=TIMEOUT_S
            ),
        )

    async def set_pod_metadata(
        self,
        namespace: str,
        name: str,
        uid: str,
        *,
        new_labels: Mapping[str, str],
        new_annotations: Mapping[str, str],
    ) -> bool:
        """Merge-patch these labels and annotations of exactly the pod with ``uid`` (the
        UID in the patch is a precondition: 409 when a same-named replacement stands
        there); False when that pod is gone. Idempotent: the same values twice change
        nothing."""
        meta = {"uid": uid, "labels": dict(new_labels), "annotations": dict(new_annotations)}
        body: Any = {"metadata": meta}
        return await self._ignore(
            (404, 409),
            f"patch pod {namespace}/{name} labels {new_labels} annotations {new_annotations}",
            lambda: self.core.patch_namespaced_pod(
                name, namespace, body, _content_type=MERGE_PATCH, _request_timeout=TIMEOUT_S
            ),
        )

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        result = await self._call(
            f"list pods {namespace} {selector}",
            lambda: self.core.list_namespaced_pod(
                namespace, label_selector=selector, _request_timeout=TIMEOUT_S
            ),
        )
        return [self._dict(p) for p in result.items]

    # -- events -------------------------------------------------------------------

    async def post_event(
        self, job: Mapping[str, Any], etype: str, reason: str, message: str, now: dt.datetime
    ) -> None:
        meta = job["metadata"]
        stamp = format_time(now)
        body: Any = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": labels.API_VERSION,
                "kind": labels.KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "type": etype,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": COMPONENT,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        await self._call(
            f"post event {reason} on {meta['namespace']}/{meta['name']}",
            lambda: self.core.create_namespaced_event(
                meta["namespace"], body, _request_timeout=TIMEOUT_S
            ),
        )

    # -- the leader-election Lease (election/leader decide; never fenced) --------------

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Lease as a dict, or None when it does not exist."""
        return await self._get_or_none(
            f"get lease {namespace}/{name}",
            lambda: self.coordination.read_namespaced_lease(
                name, namespace, _request_timeout=TIMEOUT_S
            ),
            convert=self._dict,
        )

    async def create_lease(
        self, namespace: str, name: str, spec: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Create the Lease; ``ConflictError`` when another replica created it first."""
        body: Any = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace},
            "spec": dict(spec),
        }
        obj = await self._call(
            f"create lease {namespace}/{name}",
            lambda: self.coordination.create_namespaced_lease(
                namespace, body, _request_timeout=TIMEOUT_S
            ),
            fenced=False,
        )
        return self._dict(obj)

    async def replace_lease(
        self, namespace: str, name: str, resource_version: str, spec: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Write the spec if the Lease is still at ``resource_version``, else ``ConflictError``."""
        body: Any = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": resource_version},
            "spec": dict(spec),
        }
        obj = await self._call(
            f"update lease {namespace}/{name}",
            lambda: self.coordination.replace_namespaced_lease(
                name, namespace, body, _request_timeout=TIMEOUT_S
            ),
            fenced=False,
        )
        return self._dict(obj)
