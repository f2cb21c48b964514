"""The pinned tool versions, read from versions.env (the one place they live)."""

from __future__ import annotations

from pathlib import Path

_FILE = Path(__file__).with_name("versions.env")


def _load() -> dict[str, str]:
    out: dict[str, str] = {}
    for raw in _FILE.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            out[key] = value
    return out


VERSIONS = _load()
KUBERNETES_VERSION = VERSIONS["KUBERNETES_VERSION"]
ETCD_VERSION = VERSIONS["ETCD_VERSION"]
KWOK_VERSION = VERSIONS["KWOK_VERSION"]
HELM_VERSION = VERSIONS["HELM_VERSION"]
KUBECTL_WHEEL_VERSION = VERSIONS["KUBECTL_WHEEL_VERSION"]
KUBE_ROUTER_VERSION = VERSIONS["KUBE_ROUTER_VERSION"]
CLUSTER_AUTOSCALER_VERSION = VERSIONS["CLUSTER_AUTOSCALER_VERSION"]
KUEUE_VERSION = VERSIONS["KUEUE_VERSION"]
# The real-node flavor (e2e/realnode; built only by `build.sh --real-nodes`).
CONTAINERD_DEB_VERSION = VERSIONS["CONTAINERD_DEB_VERSION"]
PAUSE_VERSION = VERSIONS["PAUSE_VERSION"]
COREDNS_VERSION = VERSIONS["COREDNS_VERSION"]
