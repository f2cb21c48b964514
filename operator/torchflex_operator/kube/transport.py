"""The transport under ``Kube``: the client, typed errors, and the one call wrapper.

Where it sits: the base of the ``kube`` package (the only place that talks to the
Kubernetes API). ``KubeBase._call`` runs one blocking call of the official client in
a thread, counts it for metrics, refuses writes when this replica is not the leader,
and maps ``ApiException`` and transport failures to the operator's typed errors
(``errors``); the create/patch/ignore helpers every resource's calls share live here
too. ``calls.py`` and ``scheduling.py`` add the calls per resource.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as TransportError

from torchflex_operator.model.errors import (
    AccessDeniedError,
    ApiAbsentError,
    ConflictError,
    NotLeaderError,
    PermanentError,
    RefusedError,
    RetryableError,
)

T = TypeVar("T")
COMPONENT = "torchflex-operator"
TIMEOUT_S = 15
_WRITE_VERBS = frozenset(("create", "patch", "delete", "post", "update"))
MERGE_PATCH = "application/merge-patch+json"
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


def as_refusal(exc: PermanentError) -> PermanentError:
    """A create refused by validation or admission, as ``RefusedError`` with the
    server's message; the operator's own RBAC refusal stays ``AccessDeniedError``."""
    cause = exc.__cause__
    if isinstance(exc, AccessDeniedError) or not isinstance(cause, ApiException):
        return exc
    code = int(cause.status or 0)
    if code not in (400, 403, 422):
        return exc
    return RefusedError(str(exc), code, _message(cause) or str(cause.reason))


class KubeBase:
    """The clients, the call wrapper and the helpers the per-resource calls share."""

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
        """Kueue's Workloads and WorkloadPriorityClasses (``render.workload``)."""
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
            raise as_refusal(exc) from exc.__cause__
        current: Any = await self._call(f"get {kind} {ns}/{name}", lambda: read(name, ns))
        change = diff(manifest, self._dict(current))
        if change is not None:
            await self._call(f"patch {kind} {ns}/{name}", lambda: patch(name, ns, change))

    async def _get_or_none(
        self,
        what: str,
        fn: Callable[[], Any],
        convert: Callable[[Any], dict[str, Any]] = dict,
    ) -> dict[str, Any] | None:
        """``fn``'s object as a dict (``convert``: ``self._dict`` for the client's typed
        models), or None when the API answers 404."""
        try:
            obj: Any = await self._call(what, fn)
        except PermanentError as exc:
            if isinstance(exc.__cause__, ApiException) and exc.__cause__.status == 404:
                return None
            raise
        return convert(obj)
