"""Builders of ElasticJob objects and pod views for the operator's unit tests."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from torchflex_contract import labels
from torchflex_contract.labels import PodKind as Role
from torchflex_operator.model.observed import Observed, PodView
from torchflex_operator.model.plan import Plan
from torchflex_operator.model.spec import JobSpec
from torchflex_operator.model.status import JobStatus

NOW = dt.datetime(2025, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
NAME = "demo"
NS = "ns"


def job_obj(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "minReplicas": 2,
        "maxReplicas": 4,
        "template": {
            "spec": {
                "containers": [
                    {"name": "trainer", "image": "img", "command": ["python", "train.py"]}
                ]
            }
        },
    }
    base.update(spec)
    return {
        "apiVersion": labels.API_VERSION,
        "kind": labels.KIND,
        "metadata": {"name": NAME, "namespace": NS, "uid": "0123456789abcdef", "generation": 1},
        "spec": base,
    }


def job(**spec: Any) -> JobSpec:
    return JobSpec.parse(job_obj(**spec))


def role(name: str, lo: int, hi: int, command: str = "train.py", **fields: Any) -> dict[str, Any]:
    """One ``spec.roles`` entry whose trainer runs ``python <command>``."""
    container = {"name": "trainer", "image": "img", "command": ["python", command]}
    return {
        "name": name,
        "minReplicas": lo,
        "maxReplicas": hi,
        "template": {"spec": {"containers": [container]}},
        **fields,
    }


def roles_obj(*roles: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """A multi-role job: trainers 2:2 and readers 1:4 unless ``roles`` are given."""
    obj = job_obj(**spec)
    for key in ("minReplicas", "maxReplicas", "template"):
        obj["spec"].pop(key)
    obj["spec"]["roles"] = list(roles) or [
        role("trainer", 2, 2),
        role("reader", 1, 4, "read.py", nprocPerNode=2),
    ]
    return obj


def roles_job(*roles: dict[str, Any], **spec: Any) -> JobSpec:
    return JobSpec.parse(roles_obj(*roles, **spec))


def worker(index: int, phase: str = "Running", **kw: Any) -> PodView:
    ready = kw.pop("ready", phase == "Running")
    return PodView(
        name=labels.worker_pod_name(NAME, index),
        uid=kw.pop("uid", f"uid-{index}"),
        role=Role.WORKER,
        index=index,
        phase=phase,
        ready=ready,
        node_name=kw.pop("node_name", "node-a"),
        **kw,
    )


def store(phase: str = "Running", **kw: Any) -> PodView:
    return PodView(
        name=labels.store_pod_name(NAME), uid="uid-store", role=Role.STORE, phase=phase, **kw
    )


ALL_SERVICES = frozenset({labels.workers_service_name(NAME), labels.store_service_name(NAME)})


def observed(*pods: PodView, **kw: Any) -> Observed:
    kw.setdefault("services", ALL_SERVICES)
    if not any(p.role == Role.STORE for p in pods):
        pods = (*pods, store())
    return Observed(pods=tuple(pods), **kw)


def parsed(raw: Mapping[str, Any]) -> JobStatus:
    """A status as the API holds it (a dict), parsed as the reconciler parses it."""
    return JobStatus.parse(raw)


def decided(result: Plan) -> JobStatus:
    """The status a plan decided: the next pass's input."""
    assert result.status is not None, "the plan decided no status"
    return result.status


def written(result: Plan) -> dict[str, Any]:
    """The status a plan decided, as the reconciler writes it (``{}``: none)."""
    return {} if result.status is None else result.status.to_manifest()


def ago(seconds: float) -> str:
    return (NOW - dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def api_error(status: int, message: str = "") -> ApiException:
    """What the official client raises for an HTTP ``status`` answer."""
    exc = ApiException(status=status, reason="x")
    exc.body = json.dumps({"message": message})
    return exc


class ClientStandIn:
    """Stands in for one of the client's API classes (``SchedulingV1beta1Api``,
    ``PolicyV1Api``): each method answers from ``answers``, every call is recorded."""

    def __init__(self, **answers: Callable[..., Any]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, method: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((method, args, kwargs))
            return self.answers[method](*args, **kwargs)

        return call


def raising(exc: Exception) -> Callable[..., Any]:
    """An answer of ``ClientStandIn`` that raises ``exc``."""

    def answer(*_: Any, **__: Any) -> Any:
        raise exc

    return answer
