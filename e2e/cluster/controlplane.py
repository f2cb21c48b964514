"""Command lines of the control-plane daemons and the waits for each.

Where it sits: ``lifecycle.ensure_up`` starts, in order, etcd, the API
server, controller-manager, scheduler, the kwok controller (fake nodes
only) and the process kubelet, each through ``processes.spawn``. Ports are
chosen free on loopback at creation and kept in ``cluster.json``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from e2e.cluster.layout import (
    GATEWAY_IP,
    KWOK_NODE_ANNOTATION,
    KWOK_NODE_IP,
    KWOK_POD_CIDR,
    REPO_ROOT,
    SERVICE_CIDR,
    Layout,
)
from e2e.localproc import free_port
from e2e.toolchain.versions import KWOK_VERSION

# Gang scheduling of each job's minimum (docs/operations.md): the Workload and
# PodGroup API is beta in v1.37 and off by default, so every cluster turns on
# the gate in the API server (serves the API, keeps pods' spec.schedulingGroup),
# scheduler (the GangScheduling plugin, the pod-group cycle) and
# controller-manager (its PodGroup protection controller keeps a group until
# its pods are gone), and the group version in the API server.
FEATURE_GATES = "--feature-gates=GenericWorkload=true"
RUNTIME_CONFIG = "--runtime-config=scheduling.k8s.io/v1beta1=true"
# The scheduler's podMaxBackoffSeconds (default 10), what a platform team running gang
# jobs beside cluster-autoscaler would set (docs/operations.md, issue 32): v1.37's pod
# group cycle puts a gang that failed to schedule in the backoff queue, not among the
# unschedulable pods a Node's arrival wakes, so a new node waits out the rest of the
# gang's backoff (1, 2, 4, 8, 10 s, each ended on a 1 s flush): up to 11 s of an
# autoscaler growth. At 1 s a waiting gang is tried every 2 s.
SCHEDULER_POD_MAX_BACKOFF_S = 1


class ClusterStartError(RuntimeError):
    """A daemon did not become healthy in time; the message has its log tail."""


@dataclasses.dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int

    @classmethod
    def choose(cls) -> Ports:
        return cls(*(free_port() for _ in range(6)))

    @classmethod
    def load(cls, info: Path) -> Ports:
        return cls(**json.loads(info.read_text())["ports"])


def etcd_argv(bin_dir: Path, lay: Layout, p: Ports) -> list[str]:
    client = f"http://127.0.0.1:{p.etcd_client}"
    peer = f"http://127.0.0.1:{p.etcd_peer}"
    return [
        str(bin_dir / "etcd"),
        "--name=e2e",
        f"--data-dir={lay.etcd_data}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=e2e={peer}",
        "--listen-metrics-urls=",
        # Test data only: fsync costs seconds per write burst on a shared disk.
        "--unsafe-no-fsync",
        "--quota-backend-bytes=4294967296",
        "--log-level=warn",
    ]


def apiserver_argv(bin_dir: Path, lay: Layout, p: Ports) -> list[str]:
    pki = lay.pki
    return [
        str(bin_dir / "kube-apiserver"),
        f"--etcd-servers=http://127.0.0.1:{p.etcd_client}",
        # Listening on all addresses lets pods on the bridge reach it at the
        # gateway address; clients on the host use 127.0.0.1.
        "--bind-address=0.0.0.0",
        f"--advertise-address={GATEWAY_IP}",
        f"--secure-port={p.apiserver}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
        "--kubelet-preferred-address-types=InternalIP",
        # kubectl logs: the process kubelet's serving certificate is checked.
        f"--kubelet-certificate-authority={pki / 'ca.crt'}",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        "--allow-privileged=true",
        "--profiling=false",
        "--endpoint-reconciler-type=none",
        FEATURE_GATES,
        RUNTIME_CONFIG,
        "--v=1",
    ]


def controller_manager_argv(bin_dir: Path, lay: Layout, p: Ports) -> list[str]:
    kc = lay.root / "controller-manager.kubeconfig"
    pki = lay.pki
    return [
        str(bin_dir / "kube-controller-manager"),
        f"--kubeconfig={kc}",
        f"--authentication-kubeconfig={kc}",
        f"--authorization-kubeconfig={kc}",
        "--bind-address=127.0.0.1",
        f"--secure-port={p.controller_manager}",
        "--leader-elect=false",
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--root-ca-file={pki / 'ca.crt'}",
        f"--cluster-signing-cert-file={pki / 'ca.crt'}",
        f"--cluster-signing-key-file={pki / 'ca.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allocate-node-cidrs=false",
        "--controllers=*,-node-ipam-controller",
        # Tests delete nodes and expect pods to be replaced without a long wait.
        "--terminated-pod-gc-threshold=1000",
        "--node-monitor-grace-period=20s",
        FEATURE_GATES,
        "--v=1",
    ]


def scheduler_config(lay: Layout, max_backoff_s: int) -> Path:
    """The scheduler's ``--config`` (its connection and the pod backoff; the rest default)."""
    path = lay.root / "scheduler-config.yaml"
    path.write_text(
        "apiVersion: kubescheduler.config.k8s.io/v1\n"
        "kind: KubeSchedulerConfiguration\n"
        f"clientConnection: {{kubeconfig: {json.dumps(str(lay.root / 'scheduler.kubeconfig'))}}}\n"
        "leaderElection: {leaderElect: false}\n"
        "podInitialBackoffSeconds: 1\n"
        f"podMaxBackoffSeconds: {max_backoff_s}\n"
    )
    return path


def scheduler_argv(
    bin_dir: Path, lay: Layout, p: Ports, max_backoff_s: int = SCHEDULER_POD_MAX_BACKOFF_S
) -> list[str]:
    kc = lay.root / "scheduler.kubeconfig"
    return [
        str(bin_dir / "kube-scheduler"),
        f"--config={scheduler_config(lay, max_backoff_s)}",
        f"--authentication-kubeconfig={kc}",
        f"--authorization-kubeconfig={kc}",
        "--bind-address=127.0.0.1",
        f"--secure-port={p.scheduler}",
        "--leader-elect=false",
        FEATURE_GATES,
        "--v=1",
    ]


def kwok_stage_files() -> list[Path]:
    """kwok's own stage definitions, read from the pinned module in the Go cache."""
    cache = Path(os.environ.get("GOMODCACHE", Path.home() / ".cache" / "torchflex" / "gomod"))
    stages = cache / "sigs.k8s.io" / f"kwok@{KWOK_VERSION}" / "kustomize" / "stage"
    files = [
        stages / "node" / "fast" / "node-initialize.yaml",
        stages / "node" / "heartbeat-with-lease" / "node-heartbeat-with-lease.yaml",
        *sorted((stages / "pod" / "fast").glob("pod-*.yaml")),
    ]
    missing = [f for f in files if not f.exists()]
    if missing:
        raise ClusterStartError(f"kwok stage files missing (run make toolchain): {missing}")
    return files


def kwok_argv(bin_dir: Path, lay: Layout, p: Ports) -> list[str]:
    return [
        str(bin_dir / "kwok"),
        f"--kubeconfig={lay.root / 'admin.kubeconfig'}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
        f"--cidr={KWOK_POD_CIDR}",
        f"--node-ip={KWOK_NODE_IP}",
        "--server-address=127.0.0.1:" + str(p.kwok),
        "--node-lease-duration-seconds=40",
        *(f"--config={f}" for f in kwok_stage_files()),
    ]


def kubelet_argv(lay: Layout, nodes: list[str]) -> list[str]:
    argv = [sys.executable, "-m", "e2e.kubelet", f"--state-dir={lay.root}"]
    return argv + [f"--node={n}" for n in nodes]


def kubelet_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _ssl_context(pki: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    return ctx


def wait_http(url: str, timeout_s: float, what: str, log_tail: str, pki: Path | None) -> None:
    """Poll a health URL (bounded) until it answers 200."""
    ctx = _ssl_context(pki) if pki is not None else None
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError) as exc:
            last = str(exc)
        time.sleep(0.2)
    raise ClusterStartError(f"{what} not healthy after {timeout_s:.0f}s ({last})\n{log_tail}")
