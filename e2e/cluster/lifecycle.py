"""Bring the local control plane up (or reuse it) and tear it down.

Where it sits: the single entry for ``make cluster``, ``make cluster-down``,
the pytest session fixture, the demo and the benchmarks. ``ensure_up`` is
idempotent: when every daemon recorded in the state directory still runs and
the API server is ready, it returns the existing cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import time
import urllib.request
from pathlib import Path

from e2e.cluster import enforcer, firewall, network, pki, processes
from e2e.cluster.controlplane import (
    SCHEDULER_POD_MAX_BACKOFF_S,
    ClusterStartError,
    Ports,
    apiserver_argv,
    controller_manager_argv,
    etcd_argv,
    kubelet_argv,
    kubelet_env,
    kwok_argv,
    scheduler_argv,
    wait_http,
)
from e2e.cluster.handle import Cluster
from e2e.cluster.layout import (
    PROCESS_NODE_IP_PREFIX,
    REPO_ROOT,
    SLOT,
    Layout,
    state_dir,
    toolchain_bin_dir,
)
from e2e.kubelet.logserver import KUBELET_PORT
from e2e.localproc import listening

DAEMONS = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kubelet"]
DEFAULT_NODES = ["tf-node-0"]
START_TIMEOUT_S = 90.0
# The toolchain parts (e2e/toolchain/build.sh) every cluster runs: etcd, the
# Kubernetes control plane, kwok. All `make demo` builds.
CONTROL_PLANE_PARTS = ("control-plane",)


def _insecure() -> ssl.SSLContext:
    # Controller-manager and scheduler serve self-signed health endpoints.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _wait_insecure(url: str, what: str, lay: Layout, name: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2, context=_insecure()) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if not processes.alive(lay.pids, name):
            break
        time.sleep(0.2)
    raise ClusterStartError(f"{what} not healthy\n{processes.exit_status_hint(lay.logs, name)}")


def _running(lay: Layout) -> Cluster | None:
    if not lay.info.exists() or not all(processes.alive(lay.pids, d) for d in DAEMONS):
        return None
    cluster = Cluster.load(lay)
    return cluster if cluster.ready() else None


def refuse_a_taken_slot(root: Path, ip: str, port: int) -> None:
    """Before starting a cluster: no other cluster may run in this slot.

    A slot's clusters share the node IPs, the bridge and the pod subnet, so a
    second one (another checkout's state directory: a clone's CI beside a
    benchmark's cluster left up) would start half-working: its kubelet's log
    endpoint cannot bind and the API server reaches the other cluster's,
    whose certificate it rejects. The first process node's log endpoint
    answering (this layout's own daemons are already stopped) says the slot
    is taken.
    """
    if listening(ip, port):
        raise ClusterStartError(
            f"cluster slot {SLOT} is taken: a process kubelet already answers on {ip}:{port},"
            f" not one of the cluster at {root}. Stop that cluster (`make cluster-down` in its"
            " checkout) or pick another slot (TORCHFLEX_CLUSTER_SLOT=0-7)."
        )


def _link_tools(lay: Layout, bin_dir: Path) -> None:
    venv_bin = REPO_ROOT / ".venv" / "bin"
    tools = {
        "kubectl": venv_bin / "kubectl",
        "helm": bin_dir / "helm",
        "kwokctl": bin_dir / "kwokctl",
    }
    for name, target in tools.items():
        link = lay.bin / name
        if link.is_symlink() or link.exists():
            link.unlink()
        if target.exists():
            link.symlink_to(target)


def _write_kubeconfigs(lay: Layout, server: str) -> None:
    for ident in ("admin", "controller-manager", "scheduler", "kubelet"):
        (lay.root / f"{ident}.kubeconfig").write_text(pki.kubeconfig_yaml(server, lay.pki, ident))
    shutil.copyfile(lay.root / "admin.kubeconfig", lay.kubeconfig)


def ensure_up(root: Path | None = None, nodes: list[str] | None = None) -> Cluster:
    """Start every missing piece, or reuse a healthy running cluster."""
    lay = Layout(root or state_dir())
    lay.ensure()
    existing = _running(lay)
    if existing is not None:
        # helm and kwokctl may have been built since it started (`make demo` builds
        # neither; a test tier run next needs helm on this cluster's PATH).
        _link_tools(lay, existing.bin_dir)
        return existing
    tear_down(lay.root, remove_state=False)
    refuse_a_taken_slot(lay.root, f"{PROCESS_NODE_IP_PREFIX}.1", KUBELET_PORT)
    lay.ensure()
    # Only what this cluster runs (the parts a test adds, it builds: tests/conftest.py).
    enforce = os.environ.get(enforcer.ENV_START_WITH_CLUSTER) == "1"
    bin_dir = toolchain_bin_dir(*CONTROL_PLANE_PARTS, *(["kube-router"] if enforce else []))
    nodes = nodes or DEFAULT_NODES
    network.ensure_bridge()
    pki.ensure_pki(lay.pki)
    ports = Ports.choose()
    server = f"https://127.0.0.1:{ports.apiserver}"
    _write_kubeconfigs(lay, server)
    lay.info.write_text(
        json.dumps({"ports": ports.__dict__, "nodes": nodes, "bin_dir": str(bin_dir)}, indent=1)
    )

    processes.spawn("etcd", etcd_argv(bin_dir, lay, ports), lay.pids, lay.logs)
    wait_http(
        f"http://127.0.0.1:{ports.etcd_client}/health",
        START_TIMEOUT_S,
        "etcd",
        processes.exit_status_hint(lay.logs, "etcd"),
        None,
    )
    processes.spawn("kube-apiserver", apiserver_argv(bin_dir, lay, ports), lay.pids, lay.logs)
    try:
        wait_http(f"{server}/readyz", START_TIMEOUT_S, "kube-apiserver", "", lay.pki)
    except ClusterStartError as exc:
        raise ClusterStartError(
            f"{exc}\n{processes.exit_status_hint(lay.logs, 'kube-apiserver')}"
        ) from None
    processes.spawn(
        "kube-controller-manager",
        controller_manager_argv(bin_dir, lay, ports),
        lay.pids,
        lay.logs,
    )
    processes.spawn("kube-scheduler", scheduler_argv(bin_dir, lay, ports), lay.pids, lay.logs)
    processes.spawn("kwok", kwok_argv(bin_dir, lay, ports), lay.pids, lay.logs)
    processes.spawn("kubelet", kubelet_argv(lay, nodes), lay.pids, lay.logs, env=kubelet_env())
    _wait_insecure(
        f"https://127.0.0.1:{ports.controller_manager}/healthz",
        "kube-controller-manager",
        lay,
        "kube-controller-manager",
    )
    _wait_insecure(
        f"https://127.0.0.1:{ports.scheduler}/healthz", "kube-scheduler", lay, "kube-scheduler"
    )
    _link_tools(lay, bin_dir)
    cluster = Cluster.load(lay)
    cluster.wait_nodes_ready(nodes, START_TIMEOUT_S)
    if enforce:
        enforcer.start(lay, bin_dir, nodes[0])
    return cluster


def restart_scheduler(cluster: Cluster, max_backoff_s: int = SCHEDULER_POD_MAX_BACKOFF_S) -> None:
    """Run the cluster's scheduler again with ``podMaxBackoffSeconds`` = ``max_backoff_s``
    (``benchmarks.autoscaler --scheduler-max-backoff``: the figure before and after)."""
    lay = cluster.layout
    processes.stop(lay.pids, "kube-scheduler")
    argv = scheduler_argv(cluster.bin_dir, lay, Ports.load(lay.info), max_backoff_s)
    processes.spawn("kube-scheduler", argv, lay.pids, lay.logs)
    port = Ports.load(lay.info).scheduler
    _wait_insecure(f"https://127.0.0.1:{port}/healthz", "kube-scheduler", lay, "kube-scheduler")


def tear_down(root: Path | None = None, remove_state: bool = True) -> None:
    """Stop our daemons by PID, remove pod namespaces, the bridge and state."""
    lay = Layout(root or state_dir())
    # A real node (e2e.realnode) first: its daemons and mounts live in lay.root.
    from e2e.realnode.node import real_node_down

    real_node_down(lay.root)
    unremoved: firewall.FirewallError | None = None
    if lay.pids.exists():
        # The enforcer first: stopping it also removes its rules from the host's filter
        # table. Should that fail, the rest still goes down and the error is raised last.
        try:
            enforcer.stop(lay)
        except firewall.FirewallError as exc:
            unremoved = exc
        # Then the kubelet: it stops the pods' processes it started.
        processes.stop_all(lay.pids, ["kubelet", *reversed(DAEMONS[:-1])])
    for ns in network.list_pod_netns():
        network.delete_netns(ns)
    network.delete_bridge()
    if remove_state and lay.root.exists():
        shutil.rmtree(lay.root, ignore_errors=True)
    elif lay.etcd_data.exists():
        shutil.rmtree(lay.etcd_data, ignore_errors=True)
        shutil.rmtree(lay.pods, ignore_errors=True)
    if unremoved is not None:
        raise unremoved


def shell_exports(cluster: Cluster) -> str:
    path = os.pathsep.join([str(cluster.layout.bin), "$PATH"])
    return f"export KUBECONFIG={cluster.kubeconfig}\nexport PATH={path}\n"
