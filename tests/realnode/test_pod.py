"""One pod on a real node: containerd + runc run the image built here, the
CNI bridge plugin gives it an address on the harness's bridge, and the
kubelet serves its log to ``kubectl logs`` (issue 16, first slice); and a
running pod's downwardAPI file follows its annotation (issue 18)."""

from __future__ import annotations

import ipaddress
import json
import time
from typing import Any

from e2e.cluster import Cluster
from e2e.cluster.layout import POD_PREFIX_LEN, POD_SUBNET_PREFIX
from e2e.realnode import RealNode
from e2e.realnode.plan import BUSYBOX_IMAGE, CGROUP_ROOT, NODE_LABEL, POD_RANGE_END, POD_RANGE_START
from tests.support import wait_for
from torchflex_contract import env
from torchflex_contract.labels import Annotation

SCRIPT = (
    'echo "real node says hello from $(hostname) as uid $(id -u)"; '
    "ls /var/run/secrets/kubernetes.io/serviceaccount; "
    "cat /proc/self/cgroup; cat /proc/net/route"
)


def _pod(name: str) -> dict[str, Any]:
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


STANDBY = Annotation.STANDBY.value
STANDBY_PATH = f"{env.STANDBY_MOUNT_DIR}/{env.STANDBY_FILE_NAME}"
# Prints the standby file with the machine's uptime whenever it changes; ends
# once it reads "false" (bounded: 600 reads, 0.05 s apart).
STANDBY_PRINTER = (
    'last=""; i=0; while [ $i -lt 600 ]; do '
    f"v=$(cat {STANDBY_PATH}); "
    'if [ "$v" != "$last" ]; then echo "standby=$v at $(cut -d" " -f1 /proc/uptime)"; last=$v; fi; '
    '[ "$v" = false ] && exit 0; i=$((i + 1)); sleep 0.05; done; exit 1'
)


def _uptime() -> float:
    """The clock the container prints (/proc/uptime: no time namespace in a pod)."""
    with open("/proc/uptime") as fh:
        return float(fh.read().split()[0])


def test_downward_api_file_follows_an_annotation(
    cluster: Cluster, real_node: RealNode, namespace: str
) -> None:
    """A real kubelet rewrites a running pod's downwardAPI file after
    ``kubectl annotate --overwrite``: the warm spare's promotion channel
    (issue 18). Prints the latency seen; asserts no time."""
    pod = _pod("spare")
    pod["metadata"] = {"name": "spare", "annotations": {STANDBY: "true"}}
    field = f"metadata.annotations['{STANDBY}']"
    item = {"path": env.STANDBY_FILE_NAME, "fieldRef": {"fieldPath": field}}
    spec: dict[str, Any] = pod["spec"]
    spec["volumes"] = [{"name": env.STANDBY_VOLUME, "downwardAPI": {"items": [item]}}]
    (container,) = spec["containers"]
    container["command"] = ["/bin/sh", "-c", STANDBY_PRINTER]
    container["volumeMounts"] = [
        {"name": env.STANDBY_VOLUME, "mountPath": env.STANDBY_MOUNT_DIR, "readOnly": True}
    ]
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(pod))

    def log() -> str:
        return cluster.kubectl("logs", "spare", "-n", namespace, check=False).stdout

    wait_for(lambda: "standby=true" in log(), 120, "the spare printing its standby file")
    before = _uptime()
    cluster.kubectl("annotate", "--overwrite", "pod", "spare", "-n", namespace, f"{STANDBY}=false")
    patched = _uptime()
    wait_for(lambda: "standby=false" in log(), 60, "the new annotation in the pod's file")
    lines = log().splitlines()
    print("\n".join(lines))
    assert [line.split(" at ")[0] for line in lines] == ["standby=true", "standby=false"]
    seen = float(lines[1].split(" at ")[1])
    print(
        f"kubectl annotate started -> file rewritten in the pod: {seen - before:.2f}s "
        f"(kubectl itself returned after {patched - before:.2f}s)"
    )
    wait_for(
        lambda: (
            cluster.get_json("pod", "spare", "-n", namespace)["status"].get("phase") == "Succeeded"
        ),
        60,
        "pod spare to finish once it read the new value",
    )
