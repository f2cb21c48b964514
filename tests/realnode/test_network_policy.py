"""Issue 30 on a real node: kube-router's firewall enforces the operator's NetworkPolicy
between containerd pods on the CNI bridge.

Where it sits: the real-node tier. The whole attack on an ElasticJob runs on
the process kubelet (tests/e2e/test_tenancy.py); here the same enforcer
(``e2e.cluster.enforcer``, started for the real node's name: its pods'
``status.hostIP`` is the node's InternalIP, the bridge address) guards pods
that containerd and runc run, wired by the CNI bridge plugin. The pods are
busybox (the agent image is GBs): a server labelled as a pod of job ``web``
listens on the store's port, and the policy is the one the operator renders
for job ``web`` (``render.netpol``, its owner reference dropped: there is no
ElasticJob to own it here). A pod of another namespace is refused, a pod
with the job's label in its namespace connects, and once the policy is
deleted the same pod of the other namespace connects (the test bites).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from e2e.cluster import Cluster, enforcer, firewall
from e2e.realnode import RealNode
from e2e.realnode.plan import BUSYBOX_IMAGE, NODE_LABEL
from tests.support import fresh_namespace, wait_for
from torchflex_contract import env, labels
from torchflex_operator.model.settings import Settings
from torchflex_operator.model.spec import JobSpec
from torchflex_operator.render import netpol

JOB = "web"
PORT = env.DEFAULT_STORE_PORT
# The server answers every connection (-ll: persistent, -e: one echo each).
SERVER = f"/bin/busybox nc -ll -p {PORT} -e /bin/echo ok"
# A client tries once (refused at once by the REJECT), or retries while the
# enforcer adds a new admitted pod's address to the policy's ipset.
CONNECT = "/bin/busybox nc -w 3 {ip} {port} </dev/null && echo connected"
RETRY = "i=0; while [ $i -lt 30 ]; do {connect} && exit 0; i=$((i+1)); sleep 1; done; exit 1"


@pytest.fixture()
def other_namespace(cluster: Cluster) -> Iterator[str]:
    with fresh_namespace(cluster, "atk") as name:
        yield name


@pytest.fixture()
def enforced(cluster: Cluster, real_node: RealNode) -> Iterator[None]:
    enforcer.start(cluster.layout, cluster.bin_dir, real_node.name)
    try:
        yield
    finally:
        enforcer.stop(cluster.layout)


def _pod(name: str, script: str, pod_labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": pod_labels},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {NODE_LABEL: "true"},
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": BUSYBOX_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", script],
                }
            ],
        },
    }


def _run(cluster: Cluster, namespace: str, pod: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(pod))


def _client(cluster: Cluster, namespace: str, name: str, ip: str, **kw: Any) -> tuple[int, str]:
    """A client pod's exit code and log, once it has ended."""
    connect = CONNECT.format(ip=ip, port=PORT)
    script = RETRY.format(connect=connect) if kw.get("retry") else connect
    _run(cluster, namespace, _pod(name, script, kw.get("pod_labels") or {}))

    def phase() -> str:
        got = cluster.get_json("pod", name, "-n", namespace)
        return str(got.get("status", {}).get("phase", ""))

    wait_for(lambda: phase() in ("Succeeded", "Failed"), 120, f"client {namespace}/{name}")
    log = cluster.kubectl("logs", name, "-n", namespace, check=False).stdout
    code = 0 if phase() == "Succeeded" else 1
    print(f"{namespace}/{name} -> {ip}:{PORT}: exit {code}: {log.strip()}")
    return code, log


def _policy(namespace: str) -> dict[str, Any]:
    """The operator's policy for job ``web``, as it would create it."""
    body = {
        "apiVersion": "torchflex.io/v1alpha1",
        "kind": "ElasticJob",
        "metadata": {"name": JOB, "namespace": namespace, "uid": "0" * 36},
        "spec": {"minReplicas": 1, "maxReplicas": 1, "template": {"spec": {"containers": []}}},
    }
    policy = netpol.network_policy(JobSpec.parse(body), Settings())
    # No ElasticJob owns it here: the garbage collector would delete it at once.
    del policy["metadata"]["ownerReferences"]
    return policy


@pytest.mark.timeout(600)
@pytest.mark.usefixtures("enforced")
def test_the_operators_policy_is_enforced_between_containerd_pods(
    cluster: Cluster, namespace: str, other_namespace: str
) -> None:
    own = {labels.Label.JOB_NAME.value: JOB}
    _run(cluster, namespace, _policy(namespace))
    _run(cluster, namespace, _pod("server", SERVER, own))
    wait_for(
        lambda: cluster.get_json("pod", "server", "-n", namespace)["status"].get("podIP"),
        120,
        "server pod address",
    )
    ip = cluster.get_json("pod", "server", "-n", namespace)["status"]["podIP"]
    policy = labels.network_policy_name(JOB)
    firewall.wait_policy_applied([ip], policy, 60)

    code, log = _client(cluster, other_namespace, "attacker", ip)
    assert code != 0 and "connected" not in log, log
    assert "refused" in log, log  # REJECT, not a silent drop
    code, log = _client(cluster, namespace, "peer", ip, retry=True, pod_labels=own)
    assert code == 0 and "ok" in log and "connected" in log, log

    # Without the policy the same client gets in: the refusal above was the policy's.
    cluster.kubectl("delete", "networkpolicy", policy, "-n", namespace)
    wait_for(
        lambda: not firewall.policy_applied(firewall.save_filter(), ip, policy),
        60,
        f"kube-router to drop {policy}",
    )
    code, log = _client(cluster, other_namespace, "attacker-open", ip)
    assert code == 0 and "connected" in log, log
