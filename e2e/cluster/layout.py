"""Where the local cluster keeps its state, and the fixed network plan.

Where it sits: read by every other module of ``e2e.cluster`` and by the
process kubelet. One directory (``.cluster/`` in the checkout, or
``$TORCHFLEX_CLUSTER_DIR``) holds pki, data, logs, pids and the kubeconfig;
``make cluster-down`` removes it. ``$TORCHFLEX_CLUSTER_SLOT`` picks one of
several clusters that can run side by side (see below).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path
from typing import Final

REPO_ROOT: Final = Path(__file__).resolve().parents[2]

# Several clusters can run side by side on one machine, one per slot
# (``$TORCHFLEX_CLUSTER_SLOT``, 0-7, default 0): each slot has its own
# bridge, address ranges, netns prefix and state directory, so parallel
# work never shares (or tears down) another slot's cluster.
MAX_SLOTS: Final = 8


def cluster_slot() -> int:
    raw = os.environ.get("TORCHFLEX_CLUSTER_SLOT", "0")
    if not raw.isdigit() or int(raw) >= MAX_SLOTS:
        raise ValueError(
            f"TORCHFLEX_CLUSTER_SLOT must be an integer 0-{MAX_SLOTS - 1}, got {raw!r}"
        )
    return int(raw)


SLOT: Final = cluster_slot()

# The harness bridge: every pod gets an address here, the host side is the
# gateway. Pods get no default route, so they cannot reach anything but the
# bridge (and the API server through the gateway address).
BRIDGE: Final = f"tfbr{SLOT}"
POD_SUBNET_PREFIX: Final = f"10.{213 + 2 * SLOT}"
POD_PREFIX_LEN: Final = 16
GATEWAY_IP: Final = f"{POD_SUBNET_PREFIX}.0.1"
# Never routed anywhere; the API server only needs a range to allocate from.
SERVICE_CIDR: Final = f"10.{214 + 2 * SLOT}.0.0/16"
# kwok's fake nodes and pods live on loopback addresses only.
KWOK_POD_CIDR: Final = f"127.{64 + SLOT}.0.1/16"
KWOK_NODE_IP: Final = f"127.63.{SLOT}.1"
# The process kubelet's nodes: 127.10.<slot>.<n>.
PROCESS_NODE_IP_PREFIX: Final = f"127.10.{SLOT}"
NETNS_PREFIX: Final = f"tfpod{SLOT}-"
KWOK_TAINT_KEY: Final = "kwok.x-k8s.io/node"
KWOK_NODE_ANNOTATION: Final = "kwok.x-k8s.io/node"
PROCESS_NODE_LABEL: Final = "torchflex.io/e2e-node"
CLUSTER_DOMAIN: Final = "cluster.local"


def state_dir() -> Path:
    default = REPO_ROOT / (".cluster" if SLOT == 0 else f".cluster-{SLOT}")
    return Path(os.environ.get("TORCHFLEX_CLUSTER_DIR", default)).resolve()


def toolchain_bin_dir(*parts: str) -> Path:
    """The pinned binaries, building those of ``parts`` that are missing (no-op when
    warm; ``build.sh`` names the parts). Its progress lines pass through on stderr."""
    out = subprocess.run(
        ["bash", str(REPO_ROOT / "e2e" / "toolchain" / "build.sh"), *parts],
        check=True,
        stdout=subprocess.PIPE,
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
