"""One pod on a real node: containerd + runc run the image built here, the
CNI bridge plugin gives it an address on the harness's bridge, and the
kubelet serves its log to ``kubectl logs`` (issue 16, first slice)."""

from __future__ import annotations

import ipaddress
import json
import time

from e2e.cluster import Cluster
from e2e.cluster.layout import POD_PREFIX_LEN, POD_SUBNET_PREFIX
from e2e.realnode import RealNode
from e2e.realnode.plan import BUSYBOX_IMAGE, CGROUP_ROOT, NODE_LABEL, POD_RANGE_END, POD_RANGE_START
from tests.support import wait_for

SCRIPT = (
    'echo "real node says hello from $(hostname) as uid $(id -u)"; '
    "ls /var/run/secrets/kubernetes.io/serviceaccount; "
    "cat /proc/self/cgroup; cat /proc/net/route"
)


def _pod(name: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {NODE_LABEL: "true"},
            "containers": [
                {
                    "name": "main",
                    "image": BUSYBOX_IMAGE,
                    # Imported into containerd by the harness; there is no registry.
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", SCRIPT],
                }
            ],
        },
    }


def test_pod_runs_to_completion_and_logs(
    cluster: Cluster, real_node: RealNode, namespace: str
) -> None:
    t0 = time.monotonic()
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(_pod("hello")))
    wait_for(
        lambda: (
            cluster.get_json("pod", "hello", "-n", namespace)["status"].get("phase")
            in ("Succeeded", "Failed")
        ),
        120,
        "pod hello to finish on the real node",
    )
    print(f"pod created -> finished in {time.monotonic() - t0:.1f}s")
    pod = cluster.get_json("pod", "hello", "-n", namespace)
    assert pod["status"]["phase"] == "Succeeded", pod["status"]
    assert pod["spec"]["nodeName"] == real_node.name
    (status,) = pod["status"]["containerStatuses"]
    assert status["containerID"].startswith("containerd://")
    assert status["state"]["terminated"]["exitCode"] == 0
    # The address comes from the node's slice of the harness's own bridge subnet.
    ip = ipaddress.IPv4Address(pod["status"]["podIP"])
    assert ipaddress.IPv4Address(POD_RANGE_START) <= ip <= ipaddress.IPv4Address(POD_RANGE_END)
    assert ip in ipaddress.IPv4Network(f"{POD_SUBNET_PREFIX}.0.0/{POD_PREFIX_LEN}")

    log = cluster.kubectl("logs", "hello", "-n", namespace).stdout
    print(log)
    assert "real node says hello from hello as uid 0" in log
    assert "token" in log.split()  # the kubelet projected the ServiceAccount token
    # runc put it in a cgroup under the node's own root (cgroupfs driver, v1).
    assert f":{CGROUP_ROOT}/kubepods/besteffort/pod{pod['metadata']['uid']}/" in log
    # Routes: the bridge subnet only, no default route (destination 00000000).
    routes = [line.split() for line in log.splitlines() if line.startswith("eth0\t")]
    assert routes, log
    assert all(r[1] != "00000000" for r in routes), routes
