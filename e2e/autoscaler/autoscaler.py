"""cluster-autoscaler as a harness process, against the test cloud (``cloud``).

Where it sits: harness only, started by the tests that need it (by PID, like
the control plane's daemons; ``processes`` stops it by PID). It talks to the
API server on loopback with the admin kubeconfig and to the test cloud's
gRPC bridge on loopback; its own metrics/health endpoint is bound to
loopback too. Timings are shortened for tests: a 1 s scan, idle nodes
removed after 10 s, no leader election (one replica).
"""

from __future__ import annotations

from pathlib import Path

from e2e.autoscaler.cloud import TestCloud
from e2e.cluster import processes
from e2e.cluster.handle import Cluster
from e2e.localproc import free_port
from e2e.toolchain.versions import CLUSTER_AUTOSCALER_VERSION

NAME = "cluster-autoscaler"
# What the tests change from the autoscaler's defaults, and why.
TEST_FLAGS = (
    "--scan-interval=1s",  # default 10s: a scale-up would wait for the next scan
    "--new-pod-scale-up-delay=0s",
    "--scale-down-unneeded-time=10s",  # default 10m: how long a node idles before removal
    "--scale-down-delay-after-add=10s",  # default 10m
    "--scale-down-delay-after-delete=0s",
    "--scale-down-delay-after-failure=5s",
    "--unremovable-node-recheck-timeout=5s",
    "--node-delete-delay-after-taint=0s",  # default 5s
    "--max-node-provision-time=2m",  # default 15m: a node process that never registers
    "--leader-elect=false",
    "--write-status-configmap=true",
    "--v=2",
)


def binary(cluster: Cluster) -> Path:
    return cluster.bin_dir / f"cluster-autoscaler-{CLUSTER_AUTOSCALER_VERSION}"


def argv(cluster: Cluster, cloud: TestCloud) -> list[str]:
    config = cloud.cloud_config(cluster.layout.root / "autoscaler-cloud.yaml")
    return [
        str(binary(cluster)),
        f"--kubeconfig={cluster.kubeconfig}",
        "--cloud-provider=externalgrpc",
        f"--cloud-config={config}",
        f"--address=127.0.0.1:{free_port()}",
        *TEST_FLAGS,
    ]


def start(cluster: Cluster, cloud: TestCloud) -> int:
    lay = cluster.layout
    return processes.spawn(NAME, argv(cluster, cloud), lay.pids, lay.logs)


def stop(cluster: Cluster) -> None:
    processes.stop(cluster.layout.pids, NAME)


def log_tail(cluster: Cluster, lines: int = 40) -> str:
    return processes.exit_status_hint(cluster.layout.logs, NAME, lines)
