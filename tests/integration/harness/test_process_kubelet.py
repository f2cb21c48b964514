"""The process kubelet on the real control plane: what a pod author relies on."""

from __future__ import annotations

import json
import textwrap
from typing import Any

import pytest

from e2e.cluster import Cluster
from tests.integration.harness import pods
from tests.support import wait_for

pytestmark = pytest.mark.cluster


def _pod(name: str, code: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 2,
            "containers": [{"name": "main", "image": "ignored", "command": ["python", "-c", code]}],
            **spec,
        },
    }


def field(path: str) -> dict[str, Any]:
    return {"valueFrom": {"fieldRef": {"fieldPath": path}}}


def _terminated(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    pod = pods.get(cluster, ns, name)
    assert pod is not None
    state: dict[str, Any] = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    return state


def test_exit_codes_become_phases(cluster: Cluster, namespace: str) -> None:
    pods.apply(
        cluster,
        namespace,
        _pod("ok", "import sys; sys.exit(0)"),
        _pod("bad", "import sys; sys.exit(3)"),
    )
    wait_for(lambda: pods.phase(cluster, namespace, "ok") == "Succeeded", 60, "pod ok Succeeded")
    wait_for(lambda: pods.phase(cluster, namespace, "bad") == "Failed", 60, "pod bad Failed")
    assert _terminated(cluster, namespace, "ok")["exitCode"] == 0
    bad = _terminated(cluster, namespace, "bad")
    assert bad["exitCode"] == 3
    assert bad["reason"] == "Error"


def test_env_field_refs_and_termination_message(cluster: Cluster, namespace: str) -> None:
    code = textwrap.dedent(
        """
        import json, os, socket
        keys = ["MY_POD", "MY_NS", "MY_IP", "MY_NODE", "MY_CPU", "KUBERNETES_SERVICE_HOST"]
        info = {k: os.environ.get(k) for k in keys}
        info["cwd"] = os.getcwd()
        info["hostname"] = socket.gethostname()
        open("/dev/termination-log", "w").write(json.dumps(info))
        """
    )
    pod = _pod("envs", code)
    pod["spec"]["containers"][0]["env"] = [
        {"name": "MY_POD", **field("metadata.name")},
        {"name": "MY_NS", **field("metadata.namespace")},
        {"name": "MY_IP", **field("status.podIP")},
        {"name": "MY_NODE", **field("spec.nodeName")},
        {
            "name": "MY_CPU",
            "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1"}},
        },
    ]
    pod["spec"]["containers"][0]["workingDir"] = "/tmp"
    pod["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "2"}}
    pods.apply(cluster, namespace, pod)
    wait_for(
        lambda: pods.phase(cluster, namespace, "envs") == "Succeeded", 60, "pod envs Succeeded"
    )
    info = json.loads(_terminated(cluster, namespace, "envs")["message"])
    status = pods.get(cluster, namespace, "envs")
    assert status is not None
    assert info["MY_POD"] == "envs"
    assert info["MY_NS"] == namespace
    assert info["MY_IP"] == status["status"]["podIP"]
    assert info["MY_NODE"] == cluster.process_node
    assert info["MY_CPU"] == "2"
    assert info["cwd"] == "/tmp"
    assert info["hostname"] == "envs"
    assert info["KUBERNETES_SERVICE_HOST"]


def test_delete_sends_sigterm_then_sigkill(cluster: Cluster, namespace: str, tmp_path: Any) -> None:
    code = textwrap.dedent(
        """
        import signal, time
        def on_term(*_):
            open("/out/events", "a").write("TERM\\n")
        signal.signal(signal.SIGTERM, on_term)
        open("/out/events", "a").write("START\\n")
        for _ in range(600):
            time.sleep(0.1)
        open("/out/events", "a").write("FINISHED\\n")
        """
    )
    pod = _pod("stubborn", code, volumes=[{"name": "out", "hostPath": {"path": str(tmp_path)}}])
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "out", "mountPath": "/out"}]
    pods.apply(cluster, namespace, pod)
    events = tmp_path / "events"
    wait_for(lambda: events.exists() and "START" in events.read_text(), 60, "process started")
    cluster.kubectl("delete", "pod", "stubborn", "-n", namespace, "--wait=false")
    wait_for(lambda: pods.get(cluster, namespace, "stubborn") is None, 60, "pod removed")
    # SIGTERM was seen and ignored; SIGKILL ended it before the loop finished.
    assert events.read_text().splitlines() == ["START", "TERM"]


SERVER = textwrap.dedent(
    """
    import socket
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 7000)); s.listen()
    while True:
        c, _ = s.accept(); c.sendall(socket.gethostname().encode() + b"\\n"); c.close()
    """
)

CLIENT = textwrap.dedent(
    """
    import json, socket, sys, time
    out = {}
    for name in sys.argv[1:]:
        for _ in range(100):
            try:
                with socket.create_connection((name, 7000), timeout=2) as c:
                    out[name] = c.recv(100).decode().strip(); break
            except OSError as exc:
                out[name] = f"error: {exc}"; time.sleep(0.2)
    open("/dev/termination-log", "w").write(json.dumps(out))
    """
)


def _server_pod() -> dict[str, Any]:
    pod = _pod("srv", SERVER, hostname="srv", subdomain="talk")
    pod["metadata"]["labels"] = {"app": "srv"}
    return pod


def _client_result(cluster: Cluster, ns: str, name: str, targets: list[str]) -> dict[str, str]:
    pod = _pod(name, CLIENT)
    pod["spec"]["containers"][0]["command"] += targets
    pods.apply(cluster, ns, pod)
    wait_for(lambda: pods.phase(cluster, ns, name) in ("Succeeded", "Failed"), 60, f"{name} done")
    result: dict[str, str] = json.loads(_terminated(cluster, ns, name)["message"])
    return result


def test_pods_talk_by_dns_names_across_replacement(cluster: Cluster, namespace: str) -> None:
    headless = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "talk"},
        "spec": {"clusterIP": "None", "selector": {"app": "srv"}, "ports": [{"port": 7000}]},
    }
    pods.apply(cluster, namespace, headless, _server_pod())
    wait_for(lambda: pods.phase(cluster, namespace, "srv") == "Running", 60, "server Running")
    targets = ["srv.talk", f"srv.talk.{namespace}.svc.cluster.local", "talk", f"talk.{namespace}"]
    first = _client_result(cluster, namespace, "client-1", targets)
    assert first == dict.fromkeys(targets, "srv")
    ip_before = (pods.get(cluster, namespace, "srv") or {})["status"]["podIP"]

    cluster.kubectl("delete", "pod", "srv", "-n", namespace, "--grace-period=1")
    pods.apply(cluster, namespace, _server_pod())
    wait_for(lambda: pods.phase(cluster, namespace, "srv") == "Running", 60, "server Running again")
    second = _client_result(cluster, namespace, "client-2", targets)
    assert second == dict.fromkeys(targets, "srv")
    ip_after = (pods.get(cluster, namespace, "srv") or {})["status"]["podIP"]
    assert ip_before and ip_after


def test_in_cluster_config_enforces_rbac(cluster: Cluster, namespace: str) -> None:
    rbac: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader"}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "reader-can-read"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "pod-reader",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
        },
    ]
    code = textwrap.dedent(
        """
        import json
        from kubernetes import client, config
        config.load_incluster_config()
        v1 = client.CoreV1Api()
        ns = open("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read()
        out = {"pods": len(v1.list_namespaced_pod(ns).items)}
        try:
            v1.list_namespaced_secret(ns)
            out["secrets"] = "allowed"
        except client.ApiException as exc:
            out["secrets"] = exc.status
        open("/dev/termination-log", "w").write(json.dumps(out))
        """
    )
    pods.apply(cluster, namespace, *rbac)
    pods.apply(cluster, namespace, _pod("incluster", code, serviceAccountName="reader"))
    wait_for(
        lambda: pods.phase(cluster, namespace, "incluster") in ("Succeeded", "Failed"), 60, "done"
    )
    result = json.loads(_terminated(cluster, namespace, "incluster")["message"])
    assert result["pods"] >= 1
    assert result["secrets"] == 403


def test_deployment_runs_through_real_controllers(cluster: Cluster, namespace: str) -> None:
    deploy = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "sleeper"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "sleeper"}},
            "template": {
                "metadata": {"labels": {"app": "sleeper"}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {
                            "name": "main",
                            "image": "ignored",
                            "command": ["python", "-c", "import time; time.sleep(600)"],
                        }
                    ],
                },
            },
        },
    }
    pods.apply(cluster, namespace, deploy)

    def running() -> int:
        items = cluster.get_json("pods", "-n", namespace, "-l", "app=sleeper")["items"]
        return sum(
            1
            for p in items
            if p["status"].get("phase") == "Running"
            and p["spec"].get("nodeName") == cluster.process_node
        )

    wait_for(lambda: running() == 2, 90, "2 deployment pods Running on the process node")
    ready = cluster.get_json("deployment", "sleeper", "-n", namespace)["status"]
    assert ready.get("readyReplicas") == 2


def test_hundred_kwok_nodes_become_ready(cluster: Cluster) -> None:
    names = cluster.kwok_nodes(100, prefix="kwok-scale")
    try:
        wait_for(
            lambda: (
                sum(
                    1
                    for n in cluster.get_json("nodes", "-l", "type=kwok")["items"]
                    if n["metadata"]["name"] in names
                    and any(
                        c["type"] == "Ready" and c["status"] == "True"
                        for c in n["status"].get("conditions", [])
                    )
                )
                == 100
            ),
            120,
            "100 kwok nodes Ready",
            interval_s=1.0,
        )
        addresses = {
            a["address"]
            for n in cluster.get_json("nodes", "-l", "type=kwok")["items"]
            for a in n["status"].get("addresses", [])
            if a["type"] == "InternalIP"
        }
        assert addresses and all(a.startswith("127.") for a in addresses)
    finally:
        cluster.kubectl("delete", "nodes", *names, "--wait=false", check=False)
