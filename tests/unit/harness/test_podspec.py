"""Pure parts of the process kubelet: env resolution, names, status phases."""

from __future__ import annotations

from typing import Any

import pytest

from e2e.kubelet import podspec, status


def _pod(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "labels": {"a": "b"}},
        "spec": spec,
        "status": {"phase": "Running", "podIP": "10.213.0.9"},
    }


@pytest.mark.parametrize(
    ("text", "value"),
    [("1", 1), ("500m", 0.5), ("2Gi", 2 * 2**30), ("3k", 3000), ("1.5", 1.5)],
)
def test_parse_quantity(text: str, value: float) -> None:
    assert podspec.parse_quantity(text) == value


def test_env_resolves_field_and_resource_refs() -> None:
    container = {
        "name": "c",
        "resources": {"limits": {"cpu": "1500m", "nvidia.com/gpu": "2"}},
        "env": [
            {"name": "A", "value": "x"},
            {"name": "B", "value": "$(A)-y-$$(A)"},
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "LBL", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['a']"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
            {
                "name": "GPU",
                "valueFrom": {"resourceFieldRef": {"resource": "limits.nvidia.com/gpu"}},
            },
            {"name": "CM", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}},
        ],
    }
    env = podspec.container_env(
        _pod(),
        container,
        node="n",
        host_ip="127.10.0.1",
        pod_ip="10.213.0.9",
        api_host="10.213.0.1",
        api_port=6443,
        config_maps={"cm": {"k": "v"}},
        secrets={},
    )
    assert env["B"] == "x-y-$(A)"
    assert (env["POD"], env["LBL"], env["IP"]) == ("p", "b", "10.213.0.9")
    assert env["CPU"] == "2"  # rounded up, as Kubernetes does
    assert env["GPU"] == "2"
    assert env["CM"] == "v"
    assert env["KUBERNETES_SERVICE_HOST"] == "10.213.0.1"


def test_unsupported_field_ref_is_a_clear_error() -> None:
    container = {
        "name": "c",
        "env": [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.bogus"}}}],
    }
    with pytest.raises(podspec.UnsupportedSpecError, match=r"spec\.bogus"):
        podspec.container_env(
            _pod(), container, node="n", host_ip="h", pod_ip="i", api_host="a",
            api_port=1, config_maps={}, secrets={},
        )  # fmt: skip


def test_container_without_command_is_refused() -> None:
    with pytest.raises(podspec.UnsupportedSpecError, match="no command"):
        podspec.container_argv({"name": "c", "image": "x"}, {})


def test_hosts_file_maps_pods_and_services_never_cluster_ips() -> None:
    me = _pod(hostname="w0", subdomain="job")
    peer = _pod(hostname="w1", subdomain="job")
    peer["metadata"] = {**peer["metadata"], "name": "p1", "uid": "u2"}
    peer["status"] = {"phase": "Running", "podIP": "10.213.0.10"}
    other_ns = _pod()
    other_ns["metadata"] = {"name": "q", "namespace": "elsewhere", "uid": "u3", "labels": {}}
    svc = {
        "metadata": {"name": "job", "namespace": "ns"},
        "spec": {"clusterIP": "10.214.0.7", "selector": {"a": "b"}},
    }
    text = podspec.hosts_file(me, "10.213.0.9", [me, peer, other_ns], [svc])
    assert "10.213.0.9\tw0.job.ns.svc.cluster.local w0.job.ns.svc w0.job.ns w0.job w0" in text
    assert "10.213.0.10\tw1.job.ns.svc.cluster.local" in text
    assert "10.213.0.10\tjob.ns.svc.cluster.local job.ns.svc job.ns job" in text
    assert "10.214.0.7" not in text


@pytest.mark.parametrize(
    ("exits", "policy", "phase"),
    [
        ([None], "Never", "Running"),
        ([0], "Never", "Succeeded"),
        ([3], "Never", "Failed"),
        ([0, 3], "Never", "Failed"),
        ([3], "OnFailure", "Running"),
        ([0], "OnFailure", "Succeeded"),
        ([0], "Always", "Running"),
    ],
)
def test_phase_follows_exit_codes_and_restart_policy(
    exits: list[int | None], policy: str, phase: str
) -> None:
    records = []
    for i, code in enumerate(exits):
        rec = status.ContainerRecord(f"c{i}", "img", started_at="t")
        rec.exit_code = code
        records.append(rec)
    assert status.phase(records, policy) == phase


def test_pending_before_any_container_starts() -> None:
    assert status.phase([status.ContainerRecord("c", "img")], "Never") == "Pending"
