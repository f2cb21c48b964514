"""Spec parsing and pod/Service manifests: the env contract and command wrapping."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.operator.factories import NAME, NS, job, job_obj
from torchflex_contract import env, labels
from torchflex_operator.model.errors import InvalidSpecError
from torchflex_operator.model.settings import Settings
from torchflex_operator.model.spec import JobSpec
from torchflex_operator.render import backends, builders


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    container = pod["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_worker_pod_shape() -> None:
    pod = builders.worker_pod(job(), 2, Settings())
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["name"] == labels.worker_pod_name(NAME, 2)
    assert meta["labels"][labels.Label.REPLICA_INDEX] == "2"
    assert meta["labels"][labels.Label.ROLE] == labels.PodKind.WORKER
    assert meta["ownerReferences"][0]["controller"] is True
    assert spec["restartPolicy"] == "Never"
    assert spec["hostname"] == meta["name"]
    assert spec["subdomain"] == labels.workers_service_name(NAME)
    assert spec["containers"][0]["command"] == ["torchflex-agent", "--", "python", "train.py"]
    keys = {t["key"] for t in spec["tolerations"]}
    assert "node.kubernetes.io/unreachable" in keys


def test_env_contract() -> None:
    values = env_of(builders.worker_pod(job(), 1, Settings()))
    assert values[env.JOB_NAME] == NAME
    assert values[env.REPLICA_INDEX] == "1"
    assert values[env.NNODES] == "2:4"
    assert values[env.NPROC_PER_NODE] == "auto"
    assert values[env.RDZV_BACKEND] == "c10d"
    assert values[env.RDZV_ENDPOINT] == f"{labels.store_service_name(NAME)}.{NS}:29400"
    assert values[env.RDZV_ID] == f"{NS}-{NAME}-01234567"
    assert values[env.MAX_RESTARTS] == "3"
    assert values[env.POD_IP] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env.GPU_LIMIT not in values


def test_gpu_limit_and_tls() -> None:
    spec = job_obj(
        rendezvous={"backend": "etcd", "endpoint": "https://e:2379", "tlsSecretName": "s"}
    )
    spec["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu": 2}
    }
    pod = builders.worker_pod(JobSpec.parse(spec), 0, Settings())
    values = env_of(pod)
    assert values[env.GPU_LIMIT]["resourceFieldRef"]["resource"] == "limits.nvidia.com/gpu"
    assert values[env.RDZV_TLS_DIR] == env.RDZV_TLS_MOUNT
    assert values[env.RDZV_ENDPOINT] == "https://e:2379"
    assert pod["spec"]["volumes"][0]["secret"]["secretName"] == "s"


@pytest.mark.parametrize(
    ("command", "args", "expected"),
    [
        (
            ["python", "t.py"],
            ["--lr", "1"],
            ["torchflex-agent", "--", "python", "t.py", "--lr", "1"],
        ),
        (["torchrun", "t.py"], None, ["torchrun", "t.py"]),
        (["/usr/bin/torchflex-agent", "--", "x"], None, ["/usr/bin/torchflex-agent", "--", "x"]),
    ],
)
def test_command_wrapping(command: list[str], args: list[str] | None, expected: list[str]) -> None:
    container: dict[str, Any] = {"command": command}
    if args:
        container["args"] = args
    builders.wrap_command(container, "torchflex-agent")
    assert container["command"] == expected
    assert "args" not in container or container["command"][0] == "torchrun"


def test_user_env_kept_and_contract_wins() -> None:
    obj = job_obj()
    obj["spec"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "FOO", "value": "bar"},
        {"name": env.JOB_NAME, "value": "spoofed"},
    ]
    values = env_of(builders.worker_pod(JobSpec.parse(obj), 0, Settings()))
    assert values["FOO"] == "bar"
    assert values[env.JOB_NAME] == NAME


def test_store_pod_and_services() -> None:
    pod = backends.store_pod(job(), Settings())
    assert pod["spec"]["containers"][0]["command"][:2] == ["torchflex-agent", "store"]
    assert pod["spec"]["restartPolicy"] == "Always"
    store = pod["spec"]["containers"][0]
    # Not BestEffort (requests set), probed on its port.
    assert store["resources"]["requests"] == {"cpu": "100m", "memory": "512Mi"}
    assert "limits" not in store["resources"]
    assert store["livenessProbe"]["tcpSocket"]["port"] == store["ports"][0]["containerPort"]
    assert store["readinessProbe"]["tcpSocket"]["port"] == store["ports"][0]["containerPort"]
    # Its resolver is loopback: torch's server looks up every accepted peer on
    # its one loop thread, and a lookup must fail at once, never wait on DNS.
    assert pod["spec"]["dnsPolicy"] == "None"
    assert pod["spec"]["dnsConfig"]["nameservers"] == ["127.0.0.1"]
    svcs = builders.services(job())
    assert all(s["spec"]["clusterIP"] == "None" for s in svcs)
    assert all(s["spec"]["publishNotReadyAddresses"] for s in svcs)


@pytest.mark.parametrize(
    "spec",
    [
        {"minReplicas": 0},
        {"minReplicas": 3, "maxReplicas": 2},
        {"rendezvous": {"backend": "etcd"}},
        {"rendezvous": {"backend": "zookeeper"}},
        {"cleanPodPolicy": "Some"},
    ],
)
def test_invalid_specs_raise_permanent_error(spec: dict[str, Any]) -> None:
    with pytest.raises(InvalidSpecError):
        job(**spec)
