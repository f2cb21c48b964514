"""Plain pods for the harness tests: build, apply, read back.

Where it sits: shared by the process kubelet's robustness tests and the
fault helpers' tests in this folder; everything goes through kubectl on the
local control plane.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import yaml

from e2e.cluster import Cluster
from e2e.kubelet import records
from e2e.kubelet.records import PodRecord
from tests.support import wait_for


def pod(name: str, code: str, *args: str, restart: str = "Never", **spec: Any) -> dict[str, Any]:
    """A pod running ``python -c code args...`` with the pod's UID in ``POD_UID``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 2,
            "containers": [
                {
                    "name": "main",
                    "image": "ignored",
                    "command": ["python", "-c", code, *args],
                    "env": [
                        {
                            "name": "POD_UID",
                            "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}},
                        }
                    ],
                }
            ],
            **spec,
        },
    }


def out_volume(p: dict[str, Any], host_dir: str) -> dict[str, Any]:
    """Mount ``host_dir`` at ``/out`` in the pod."""
    p["spec"]["volumes"] = [{"name": "out", "hostPath": {"path": host_dir}}]
    p["spec"]["containers"][0]["volumeMounts"] = [{"name": "out", "mountPath": "/out"}]
    return p


def apply(cluster: Cluster, ns: str, *docs: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump_all(docs))


def get(cluster: Cluster, ns: str, name: str) -> dict[str, Any] | None:
    out = cluster.kubectl("get", "pod", name, "-n", ns, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def phase(cluster: Cluster, ns: str, name: str) -> str:
    p = get(cluster, ns, name)
    return str(p["status"].get("phase", "")) if p else "<gone>"


def wait_phase(cluster: Cluster, ns: str, name: str, want: str, timeout_s: float = 60) -> None:
    wait_for(lambda: phase(cluster, ns, name) == want, timeout_s, f"pod {name} {want}")


def record(cluster: Cluster, ns: str, name: str) -> PodRecord:
    """The kubelet's record of the pod, once its container runs."""
    wait_for(
        lambda: _has_container(cluster, ns, name), 30, f"the kubelet's record of {name}'s process"
    )
    return records.find(cluster.layout.pods, ns, name)


def _has_container(cluster: Cluster, ns: str, name: str) -> bool:
    try:
        return bool(records.find(cluster.layout.pods, ns, name).containers)
    except LookupError:
        return False


def mac_of(netns: str) -> str:
    out = subprocess.run(
        ["ip", "-n", netns, "-j", "link", "show", "eth0"],
        capture_output=True,
        text=True,
        check=True,
    )
    return str(json.loads(out.stdout)[0]["address"])


def neighbour_mac(netns: str, ip: str) -> str | None:
    """The MAC ``netns`` would send to for ``ip`` now (None: no usable entry)."""
    out = subprocess.run(
        ["ip", "-n", netns, "-j", "neigh", "show", ip],
        capture_output=True,
        text=True,
        check=True,
    )
    entries = json.loads(out.stdout or "[]")
    macs = [e.get("lladdr") for e in entries if e.get("lladdr")]
    return str(macs[0]) if macs else None
