"""Where the local cluster keeps its state, and the fixed network plan.

Where it sits: read by every other module of ``e2e.cluster`` and by the
process kubelet. One directory (``.cluster/`` in the checkout, or
``$TORCHFLEX_CLUSTER_DIR``) holds pki, data, logs, pids and the kubeconfig;
``make cluster-down`` removes it.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path
from typing import Final

REPO_ROOT: Final = Path(__file__).resolve().parents[2]

# The harness bridge: every pod gets an address here, the host side is the
# gateway. Pods get no default route, so they cannot reach anything but the
# bridge (and the API server through the gateway address).
BRIDGE: Final = "tfbr0"
POD_SUBNET_PREFIX: Final = "10.213"
POD_PREFIX_LEN: Final = 16
GATEWAY_IP: Final = f"{POD_SUBNET_PREFIX}.0.1"
# Never routed anywhere; the API server only needs a range to allocate from.
SERVICE_CIDR: Final = "10.214.0.0/16"
# kwok's fake nodes and pods live on loopback addresses only.
KWOK_POD_CIDR: Final = "127.64.0.1/16"
KWOK_NODE_IP: Final = "127.63.0.1"
KWOK_TAINT_KEY: Final = "kwok.x-k8s.io/node"
KWOK_NODE_ANNOTATION: Final = "kwok.x-k8s.io/node"
PROCESS_NODE_LABEL: Final = "torchflex.io/e2e-node"
CLUSTER_DOMAIN: Final = "cluster.local"


def state_dir() -> Path:
    return Path(os.environ.get("TORCHFLEX_CLUSTER_DIR", REPO_ROOT / ".cluster")).resolve()


def toolchain_bin_dir() -> Path:
    """The pinned binaries; building them if missing (no-op when warm)."""
    out = subprocess.run(
        ["bash", str(REPO_ROOT / "e2e" / "toolchain" / "build.sh")],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip().splitlines()[-1])


@dataclasses.dataclass(frozen=True)
class Layout:
    root: Path

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pids(self) -> Path:
        return self.root / "pids"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd-data"

    @property
    def pods(self) -> Path:
        return self.root / "pods"

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def info(self) -> Path:
        """JSON with ports and addresses of the running cluster."""
        return self.root / "cluster.json"

    def ensure(self) -> None:
        for d in (self.pki, self.logs, self.pids, self.etcd_data, self.pods, self.bin):
            d.mkdir(parents=True, exist_ok=True)
