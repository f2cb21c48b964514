"""The one module that talks to the Kubernetes API (besides kopf's own watches).

Where it sits: the reconciler and apply layer call ``Kube``'s async methods;
each wraps a blocking call of the official client in a thread and maps
``ApiException`` to the operator's typed errors (``errors``). Creates are
idempotent (409 = already there), deletes carry a UID precondition (so a
delete never hits a same-named replacement), status writes carry the
resourceVersion they were planned from (409 = re-read and re-plan).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as TransportError

from torchflex_contract import labels
from torchflex_operator import disruption, gang, queueing
from torchflex_operator.errors import (
    AccessDeniedError,
    ApiAbsentError,
    ConflictError,
    NotLeaderError,
    PermanentError,
    RefusedError,
    RetryableError,
)
from torchflex_operator.timestamps import format_time

log = logging.getLogger(__name__)
T = TypeVar("T")
COMPONENT = "torchflex-operator"
_TIMEOUT_S = 15
_WRITE_VERBS = frozenset(("create", "patch", "delete", "post", "update"))
_MERGE_PATCH = "application/merge-patch+json"
# The authorizer's refusal reads 'User "system:serviceaccount:ns:sa" cannot get resource ...';
# admission refusals (Pod Security) and a terminating namespace are 403s without it.
_RBAC_DENIAL = re.compile(r'(User|Group) "[^"]*" cannot ')


def load_api_client() -> Any:
    """In-cluster credentials when running in a pod, else $KUBECONFIG / ~/.kube/config."""
    try:
        config.load_incluster_config()
        return client.ApiClient()
    except config.ConfigException:
        cfg = client.Configuration()
        config.load_kube_config(client_configuration=cfg)
        return client.ApiClient(cfg)


_response = threading.local()
"""The HTTP status of the last response the client received on this thread."""


def _recording_status(request: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap the client's one transport call (``RESTClientObject.request``) so the
    status of a successful response is known too: the typed API methods return
    only the body, and a delete may answer 200 or 202."""

    def request_and_record(*args: Any, **kwargs: Any) -> Any:
        response = request(*args, **kwargs)
        _response.status = getattr(response, "status", None)
        return response

    return request_and_record


def _with_status(fn: Callable[[], T]) -> tuple[T, int | None]:
    _response.status = None
    result = fn()
    return result, _response.status


def _message(exc: ApiException) -> str:
    """The API Status's message (the body is JSON), or the raw body."""
    body = exc.body.decode(errors="replace") if isinstance(exc.body, bytes) else str(exc.body or "")
    try:
        parsed = json.loads(body)
    except ValueError:
        return body
    return str(parsed.get("message", "")) if isinstance(parsed, dict) else body


def _typed(exc: ApiException, what: str) -> Exception:
    status = int(exc.status or 0)
    detail = f"{what}: HTTP {status} {exc.reason}"
    if status == 409:
        return ConflictError(detail)
    if status == 429 or status >= 500 or status == 0:
        retry = exc.headers.get("Retry-After") if exc.headers else None
        return RetryableError(detail, float(retry) if retry and retry.isdigit() else None)
    if status == 403 and _RBAC_DENIAL.search(_message(exc)):
        return AccessDeniedError(detail)
    return PermanentError(detail)


def _refusal(exc: PermanentError) -> PermanentError:
    """A create refused by validation or admission, as ``RefusedError`` with the
    server's message; the operator's own RBAC refusal stays ``AccessDeniedError``."""
    cause = exc.__cause__
    if isinstance(exc, AccessDeniedError) or not isinstance(cause, ApiException):
        return exc
    code = int(cause.status or 0)
    if code not in (400, 403, 422):
        return exc
    return RefusedError(str(exc), code, _message(cause) or str(cause.reason))


class Kube:
    def __init__(
        self, api_client: Any, on_request: Callable[[str, str], None] | None = None
    ) -> None:
        self.api = api_client
        rest = api_client.rest_client
        rest.request = _recording_status(rest.request)
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.networking = client.NetworkingV1Api(api_client)
        self.coordination = client.CoordinationV1Api(api_client)
        self.scheduling = client.SchedulingV1beta1Api(api_client)
        self.policy = client.PolicyV1Api(api_client)
        self.kueue = client.CustomObjectsApi(api_client)
        """Kueue's Workloads and WorkloadPriorityClasses (``queueing``)."""
        self.on_request = on_request
        """Called with the verb and the HTTP status code (``<error>``: no response)
        of every request made here (metrics)."""
        self.may_write: Callable[[], bool] | None = None
        """Asked before every write but the Lease's: False refuses it here (``NotLeaderError``),
        so a pass still running when this replica stops leading sends nothing more."""

    async def _call(self, what: str, fn: Callable[[], T], *, fenced: bool = True) -> T:
        verb = what.split(" ", 1)[0]
        if fenced and verb in _WRITE_VERBS and self.may_write is not None and not self.may_write():
            raise NotLeaderError(f"{what}: not sent, this replica is not the leader")
        try:
            result, status = await asyncio.to_thread(_with_status, fn)
        except ApiException as exc:
            self._count(verb, exc.status)
            raise _typed(exc, what) from exc
        # The client's own retries end in urllib3's MaxRetryError (not an OSError) when the
        # API server is down or restarting: that is as transient as a reset connection.
        except (OSError, TimeoutError, TransportError) as exc:
            self._count(verb, None)
            raise RetryableError(f"{what}: {exc}") from exc
        except Exception:
            self._count(verb, None)
            raise
        self._count(verb, status)
        return result

    def _count(self, verb: str, status: int | None) -> None:
        if self.on_request is not None:
            self.on_request(verb, str(status) if status else "<error>")

    def _dict(self, obj: Any) -> dict[str, Any]:
        return self.api.sanitize_for_serialization(obj)  # type: ignore[no-any-return]

    # -- ElasticJob ------------------------------------------------------------

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            obj: Any = await self._call(
                f"get elasticjob {namespace}/{name}",
                lambda: self.custom.get_namespaced_custom_object(
                    labels.GROUP,
                    labels.VERSION,
                    namespace,
                    labels.PLURAL,
                    name,
                    _request_timeout=_TIMEOUT_S,
                ),
            )
        except PermanentError as exc:
            if isinstance(exc.__cause__, ApiException) and exc.__cause__.status == 404:
                return None
            raise
        return dict(obj)

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
                _request_timeout=_TIMEOUT_S,
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
                _request_timeout=_TIMEOUT_S,
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
                _request_timeout=_TIMEOUT_S,
            ),
        )

    # -- pods and services --------------------------------------------------------

    async def _ignore(self, codes: tuple[int, ...], what: str, fn: Callable[[], Any]) -> bool:
        """Run ``fn``; True if it took effect, False if it answered one of ``codes``."""
        try:
            await self._call(what, fn)
        except (PermanentError, RetryableError) as exc:
            cause = exc.__cause__
            if isinstance(cause, ApiException) and cause.status in codes:
                return False
            raise
        return True

    async def create_pod(self, manifest: Mapping[str, Any]) -> str | None:
        """Create a pod; returns its UID, or None when it already exists (409)."""
        ns = manifest["metadata"]["namespace"]
        name = manifest["metadata"]["name"]
        body: Any = dict(manifest)
        try:
            created = await self._call(
                f"create pod {ns}/{name}",
                lambda: self.core.create_namespaced_pod(ns, body, _request_timeout=_TIMEOUT_S),
            )
        except ConflictError:
            return None
        except PermanentError as exc:
            raise _refusal(exc) from exc.__cause__
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
                lambda: self.core.create_namespaced_service(ns, body, _request_timeout=_TIMEOUT_S),
            )
        except PermanentError as exc:
            raise _refusal(exc) from exc.__cause__

    async def create_network_policy(self, manifest: Mapping[str, Any]) -> bool:
        ns = manifest["metadata"]["namespace"]
        name = manifest["metadata"]["name"]
        body: Any = dict(manifest)
        return await self._ignore(
            (409,),
            f"create networkpolicy {ns}/{name}",
            lambda: self.networking.create_namespaced_network_policy(
                ns, body, _request_timeout=_TIMEOUT_S
            ),
        )

    async def delete_network_policy(self, namespace: str, name: str) -> bool:
        return await self._ignore(
            (404,),
            f"delete networkpolicy {namespace}/{name}",
            lambda: self.networking.delete_namespaced_network_policy(
                name, namespace, _request_timeout=_TIMEOUT_S
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
                name, namespace, body=opts, _request_timeout=_TIMEOUT_S
            ),
        )

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        result = await self._call(
            f"list pods {namespace} {selector}",
            lambda: self.core.list_namespaced_pod(
                namespace, label_selector=selector, _request_timeout=_TIMEOUT_S
            ),
        )
        return [self._dict(p) for p in result.items]

    # -- the job's PodGroup (gang scheduling; an optional API) -----------------------

    async def pod_groups_served(self) -> bool:
        """Whether the API serves ``scheduling.k8s.io/v1beta1`` PodGroups (discovery,
        which RBAC grants every authenticated client: no rule in the chart)."""
        try:
            resources: Any = await self._call(
                "get apiresources scheduling.k8s.io/v1beta1",
                lambda: self.scheduling.get_api_resources(_request_timeout=_TIMEOUT_S),
            )
        except PermanentError as exc:
            if isinstance(exc.__cause__, ApiException) and exc.__cause__.status == 404:
                return False
            raise
        return any(r.name == "podgroups" for r in resources.resources or ())

    async def apply_pod_group(self, manifest: Mapping[str, Any]) -> None:
        """Create the PodGroup, or bring an existing one's gang ``minCount`` to the
        manifest's (the one field of it that may change). ``ApiAbsentError`` when the
        API answers 404: the group version is not served (or the namespace is gone)."""
        await self._create_or_patch(
            "podgroup",
            manifest,
            create=lambda ns, body: self.scheduling.create_namespaced_pod_group(
                ns, body, _request_timeout=_TIMEOUT_S
            ),
            read=lambda name, ns: self.scheduling.read_namespaced_pod_group(
                name, ns, _request_timeout=_TIMEOUT_S
            ),
            patch=lambda name, ns, patch: self.scheduling.patch_namespaced_pod_group(
                name, ns, patch, _content_type=_MERGE_PATCH, _request_timeout=_TIMEOUT_S
            ),
            diff=gang.min_count_patch,
        )

    # -- the job's PodDisruptionBudget (``disruption``) ----------------------------------

    async def apply_disruption_budget(self, manifest: Mapping[str, Any]) -> None:
        """Create the budget, or bring an existing one's owned fields to the manifest's."""
        await self._create_or_patch(
            "poddisruptionbudget",
            manifest,
            create=lambda ns, body: self.policy.create_namespaced_pod_disruption_budget(
                ns, body, _request_timeout=_TIMEOUT_S
            ),
            read=lambda name, ns: self.policy.read_namespaced_pod_disruption_budget(
                name, ns, _request_timeout=_TIMEOUT_S
            ),
            patch=lambda name, ns, patch: self.policy.patch_namespaced_pod_disruption_budget(
                name, ns, patch, _content_type=_MERGE_PATCH, _request_timeout=_TIMEOUT_S
            ),
            diff=disruption.spec_patch,
        )

    async def delete_disruption_budget(self, namespace: str, name: str) -> bool:
        """Delete the budget; False when it was not there (404)."""
        return await self._ignore(
            (404,),
            f"delete poddisruptionbudget {namespace}/{name}",
            lambda: self.policy.delete_namespaced_pod_disruption_budget(
                name, namespace, _request_timeout=_TIMEOUT_S
            ),
        )

    async def _create_or_patch(
        self,
        kind: str,
        manifest: Mapping[str, Any],
        *,
        create: Callable[[str, Any], Any],
        read: Callable[[str, str], Any],
        patch: Callable[[str, str, Any], Any],
        diff: Callable[[Mapping[str, Any], Mapping[str, Any]], Mapping[str, Any] | None],
    ) -> None:
        """Create ``manifest``; when it exists, merge-patch what ``diff`` (wanted, current)
        says differs. ``ApiAbsentError`` when the create answers 404."""
        ns = manifest["metadata"]["namespace"]
        name = manifest["metadata"]["name"]
        body: Any = dict(manifest)
        try:
            await self._call(f"create {kind} {ns}/{name}", lambda: create(ns, body))
            return
        except ConflictError:
            pass  # already there: compare it below
        except PermanentError as exc:
            if isinstance(exc.__cause__, ApiException) and exc.__cause__.status == 404:
                raise ApiAbsentError(str(exc)) from exc.__cause__
            raise _refusal(exc) from exc.__cause__
        current: Any = await self._call(f"get {kind} {ns}/{name}", lambda: read(name, ns))
        change = diff(manifest, self._dict(current))
        if change is not None:
            await self._call(f"patch {kind} {ns}/{name}", lambda: patch(name, ns, change))

    # -- a queued job's Kueue Workload (an optional API) --------------------------------

    async def get_workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Workload, or None when it does not exist (or Kueue is not installed)."""
        return await self._get_or_none(
            f"get workload {namespace}/{name}",
            lambda: self.kueue.get_namespaced_custom_object(
                queueing.GROUP, queueing.VERSION, namespace, queueing.PLURAL, name,
                _request_timeout=_TIMEOUT_S,
            ),
        )  # fmt: skip

    async def workload_priority(self, name: str) -> int | None:
        """A WorkloadPriorityClass's value; None when there is no such class."""
        obj = await self._get_or_none(
            f"get workloadpriorityclass {name}",
            lambda: self.kueue.get_cluster_custom_object(
                queueing.GROUP, queueing.VERSION, queueing.PRIORITY_CLASSES, name,
                _request_timeout=_TIMEOUT_S,
            ),
        )  # fmt: skip
        value = None if obj is None else obj.get("value")
        return value if isinstance(value, int) else None

    async def create_workload(self, manifest: Mapping[str, Any]) -> dict[str, Any] | None:
        """Create the Workload; None when one of that name exists already (409)."""
        ns = manifest["metadata"]["namespace"]
        body: Any = dict(manifest)
        try:
            obj: Any = await self._call(
                f"create workload {ns}/{manifest['metadata']['name']}",
                lambda: self.kueue.create_namespaced_custom_object(
                    queueing.GROUP, queueing.VERSION, ns, queueing.PLURAL, body,
                    _request_timeout=_TIMEOUT_S,
                ),
            )  # fmt: skip
        except ConflictError:
            return None
        except PermanentError as exc:
            if isinstance(exc.__cause__, ApiException) and exc.__cause__.status == 404:
                raise ApiAbsentError(str(exc)) from exc.__cause__
            raise _refusal(exc) from exc.__cause__
        return dict(obj)

    async def patch_workload_status(
        self, namespace: str, name: str, resource_version: str, patch: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Merge-patch the Workload's status, guarded by ``resource_version`` (409: re-read)."""
        body = {"metadata": {"resourceVersion": resource_version}, "status": dict(patch)}
        obj: Any = await self._call(
            f"patch workload {namespace}/{name} status",
            lambda: self.kueue.patch_namespaced_custom_object_status(
                queueing.GROUP, queueing.VERSION, namespace, queueing.PLURAL, name, body,
                _request_timeout=_TIMEOUT_S,
            ),
        )  # fmt: skip
        return dict(obj)

    async def _get_or_none(self, what: str, fn: Callable[[], Any]) -> dict[str, Any] | None:
        try:
            obj: Any = await self._call(what, fn)
        except PermanentError as exc:
            if isinstance(exc.__cause__, ApiException) and exc.__cause__.status == 404:
                return None
            raise
        return dict(obj)

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
                meta["namespace"], body, _request_timeout=_TIMEOUT_S
            ),
        )

    # -- the leader-election Lease (election/leader decide; never fenced) --------------

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Lease as a dict, or None when it does not exist."""
        try:
            obj = await self._call(
                f"get lease {namespace}/{name}",
                lambda: self.coordination.read_namespaced_lease(
                    name, namespace, _request_timeout=_TIMEOUT_S
                ),
            )
        except PermanentError as exc:
            if isinstance(exc.__cause__, ApiException) and exc.__cause__.status == 404:
                return None
            raise
        return self._dict(obj)

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
                namespace, body, _request_timeout=_TIMEOUT_S
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
                name, namespace, body, _request_timeout=_TIMEOUT_S
            ),
            fenced=False,
        )
        return self._dict(obj)
