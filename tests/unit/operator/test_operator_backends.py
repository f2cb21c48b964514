"""Table tests of the operator's backend registry: one entry per name a job spec may
give, and per backend the pod it runs, that pod's Service and the endpoint the
agents are told (and that the worker pods and the job's Services follow it)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.operator.factories import NAME, NS, job
from torchflex_contract import env, labels
from torchflex_contract.labels import Label
from torchflex_contract.labels import PodKind as Role
from torchflex_contract.rendezvous_backends import SPEC_BACKENDS
from torchflex_operator.model.errors import InvalidSpecError
from torchflex_operator.model.settings import Settings
from torchflex_operator.render import backends, builders

STORE = labels.store_pod_name(NAME)
ETCD = labels.etcd_pod_name(NAME)

# rendezvous spec -> (host pod, its role, its port, the endpoint the agents get)
CASES: list[tuple[dict[str, Any], str | None, Role | None, int | None, str]] = [
    ({}, STORE, Role.STORE, 29400, f"{STORE}.{NS}:29400"),
    ({"backend": "c10d"}, STORE, Role.STORE, 29400, f"{STORE}.{NS}:29400"),
    ({"backend": "etcd", "endpoint": "https://e1:2379,e2"}, None, None, None, "https://e1:2379,e2"),
    ({"backend": "etcd", "managedEtcd": True}, ETCD, Role.ETCD, 2379, f"http://{ETCD}.{NS}:2379"),
]
IDS = ["default", "c10d", "etcd-external", "etcd-managed"]


def test_every_spec_backend_has_one_operator_backend() -> None:
    assert list(backends.REGISTRY) == list(SPEC_BACKENDS)
    assert all(name is entry.name for name, entry in backends.REGISTRY.items())


@pytest.mark.parametrize("backend", ["memory", "zookeeper"])
def test_a_backend_outside_the_spec_is_an_invalid_spec(backend: str) -> None:
    with pytest.raises(InvalidSpecError, match=f"'{backend}' is not a valid Backend"):
        job(rendezvous={"backend": backend})


@pytest.mark.parametrize(("rdzv", "pod", "role", "port", "endpoint"), CASES, ids=IDS)
def test_host_and_endpoint(
    rdzv: dict[str, Any], pod: str | None, role: Role | None, port: int | None, endpoint: str
) -> None:
    spec = job(rendezvous=rdzv)
    host = backends.host(spec)
    assert (host and (host.pod_name, host.service_name, host.role, host.port)) == (
        pod and (pod, pod, role, port)
    )
    assert backends.endpoint(spec) == endpoint


@pytest.mark.parametrize(("rdzv", "pod", "role", "port", "endpoint"), CASES, ids=IDS)
def test_worker_env_and_services_follow_the_backend(
    rdzv: dict[str, Any], pod: str | None, role: Role | None, port: int | None, endpoint: str
) -> None:
    spec = job(rendezvous=rdzv)
    container = builders.worker_pod(spec, 0, Settings())["spec"]["containers"][0]
    values = {e["name"]: e.get("value") for e in container["env"]}
    assert values[env.RDZV_BACKEND] == rdzv.get("backend", "c10d")
    assert values[env.RDZV_ENDPOINT] == endpoint
    services = {s["metadata"]["name"]: s["spec"] for s in builders.services(spec)}
    workers = labels.workers_service_name(NAME)
    assert sorted(services) == sorted([workers] + ([pod] if pod else []))
    if pod is not None and role is not None:
        assert services[pod]["selector"] == {Label.JOB_NAME.value: NAME, Label.ROLE.value: role}
        assert services[pod]["ports"] == [{"name": role.value, "port": port, "targetPort": port}]


@pytest.mark.parametrize(("rdzv", "pod", "role", "port", "endpoint"), CASES[:2] + CASES[3:])
def test_host_pod_is_named_labelled_and_listens_where_its_service_points(
    rdzv: dict[str, Any], pod: str, role: Role, port: int, endpoint: str
) -> None:
    spec = job(rendezvous=rdzv)
    host = backends.host(spec)
    assert host is not None
    manifest = host.build(spec, Settings())
    assert manifest["metadata"]["name"] == manifest["spec"]["hostname"] == pod
    assert manifest["metadata"]["labels"][Label.ROLE] == role
    (container,) = manifest["spec"]["containers"]
    assert [p["containerPort"] for p in container["ports"]] == [port]
    assert manifest["spec"]["restartPolicy"] == "Always"


def test_managed_etcd_advertises_the_endpoint_the_agents_get() -> None:
    spec = job(rendezvous={"backend": "etcd", "managedEtcd": True})
    command = backends.etcd_pod(spec, Settings())["spec"]["containers"][0]["command"]
    assert command[command.index("--advertise-client-urls") + 1] == backends.endpoint(spec)
