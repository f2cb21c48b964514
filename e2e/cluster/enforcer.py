"""A real NetworkPolicy enforcer on the local cluster: kube-router's firewall, alone.

Where it sits: the process kubelet gives pods their own network namespaces on
the slot's bridge but enforces no NetworkPolicy, so the tenancy test starts
this (``start``) and stops it (``stop``); ``lifecycle.tear_down`` stops it
too, before the other daemons. It is not started with every cluster (the
other scenarios and the benchmarks need no policy);
``TORCHFLEX_ENFORCE_NETWORK_POLICY=1`` starts it with the cluster (``make
cluster``), for trying policies by hand.

What runs: kube-router v2.1.0 (built by ``e2e/toolchain/build.sh``) with only
its firewall (``--run-firewall``; no router, service proxy or load balancer),
IPv4 only, nothing listening (health and metrics off). It reads pods,
namespaces and NetworkPolicies from our API server, takes the pods whose
``status.hostIP`` is the node's InternalIP (the process kubelet reports the
node's 127.10.<slot>.<n> for both) and gives each a chain in the filter
table: ``--physdev-is-bridged`` rules in FORWARD catch pod-to-pod frames on
the bridge, ipsets hold a policy's peers, and what no policy admits is
REJECTed. Traffic from the node itself (``addrtype LOCAL``: the operator,
the kubelet, the tests) is always admitted, as NetworkPolicy says.

Where it runs, and why the host's namespace: bridged frames meet iptables in
the network namespace that holds the bridge, and the slot's bridge is in the
host's (the API server, the process kubelet and the real node's CNI all use
it there), so kube-router runs there too. Its objects are all its own
(``KUBE-ROUTER-*``, ``KUBE-NWPLCY-*``, ``KUBE-POD-FW-*`` chains, ``KUBE-SRC-*``
/ ``KUBE-DST-*`` ipsets, and one jump at the top of INPUT, FORWARD and
OUTPUT), their rules match this slot's pod addresses only, and ``stop``
removes every one of them (``firewall.remove_all``: kube-router leaves them
in place when it exits, and its own ``--cleanup-config`` removes none of
them). The bridge hands its frames to netfilter by its own option
(``nf_call_iptables``), never the machine-wide sysctl, and goes with the
cluster.

One at a time per machine: those names are fixed, and kube-router deletes
chains and ipsets of that shape that it did not make, so a second one
(another slot) would undo the first. A lock file held by the running
kube-router itself says which slot has it; ``start`` in another slot waits
for it (a test's worth of minutes), then fails naming that slot.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from e2e.cluster import firewall, processes
from e2e.cluster.layout import BRIDGE, SERVICE_CIDR, SLOT, Layout
from e2e.toolchain.versions import KUBE_ROUTER_VERSION

NAME = "kube-router"
LOCK = Path("/run/lock/torchflex-kube-router.lock")
START_TIMEOUT_S = 60.0
EXEC_GRACE_S = 3.0
# Another slot's tenancy test holds it for about three minutes.
LOCK_WAIT_S = 420.0
ENV_START_WITH_CLUSTER = "TORCHFLEX_ENFORCE_NETWORK_POLICY"
# What kube-router's firewall calls by name (go-iptables and its ipset handler).
TOOLS = ("iptables", "iptables-save", "iptables-restore", "ipset")
# How often it re-reads everything; pod and policy events sync at once anyway.
SYNC_PERIOD = "30s"


class EnforcerError(RuntimeError):
    """The enforcer could not start (tools missing, busy in another slot, or it died)."""


def binary(bin_dir: Path) -> Path:
    return bin_dir / f"kube-router-{KUBE_ROUTER_VERSION}"


def running(lay: Layout) -> bool:
    return processes.alive(lay.pids, NAME)


def missing_parts() -> str | None:
    """What this machine lacks to run kube-router's firewall (None: nothing)."""
    tools = [t for t in TOOLS if shutil.which(t) is None]
    if tools:
        return f"{', '.join(tools)} not installed (Debian: apt-get install iptables ipset)"
    # Present only once br_netfilter is loaded; without it bridged frames never reach iptables.
    if not Path("/proc/sys/net/bridge").is_dir():
        return "br_netfilter is not loaded (bridged frames would never reach iptables)"
    return None


def _bridge_to_netfilter() -> None:
    """Hand this slot's bridged frames to the IPv4 hooks (per bridge, not the global sysctl)."""
    out = subprocess.run(
        ["ip", "link", "set", BRIDGE, "type", "bridge", "nf_call_iptables", "1"],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise EnforcerError(f"cannot enable nf_call_iptables on {BRIDGE}: {out.stderr.strip()}")


def _try_lock() -> int | None:
    """The machine-wide lock's fd, or None while another kube-router holds it."""
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _take_lock(wait_s: float) -> int:
    deadline = time.monotonic() + wait_s
    while (fd := _try_lock()) is None:
        if time.monotonic() > deadline:
            holder = LOCK.read_text(errors="replace").strip() or "unknown"
            raise EnforcerError(
                f"another cluster slot runs kube-router's firewall ({holder}) after {wait_s:.0f}s;"
                " its chain and ipset names are fixed, so only one can run per machine"
            )
        time.sleep(1.0)
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps({"slot": SLOT, "pid_of_starter": os.getpid()}).encode())
    return fd


def argv(exe: Path, lay: Layout, node: str) -> list[str]:
    return [
        str(exe),
        f"--kubeconfig={lay.root / 'admin.kubeconfig'}",
        f"--hostname-override={node}",
        "--run-firewall=true",
        "--run-router=false",
        "--run-service-proxy=false",
        "--run-loadbalancer=false",
        "--enable-ipv4=true",
        "--enable-ipv6=false",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--iptables-sync-period={SYNC_PERIOD}",
        # Nothing listens: its health server would bind every address of the host.
        "--health-port=0",
        "--metrics-port=0",
        # Level 1 logs each sync's end ("sync iptables took"), which ``start`` waits for.
        "--v=1",
    ]


def start(lay: Layout, bin_dir: Path, node: str, lock_wait_s: float = LOCK_WAIT_S) -> int:
    """Start kube-router's firewall for this slot's cluster (idempotent); returns its PID."""
    if running(lay):
        return processes.recorded(lay.pids, NAME)[0]
    lacking = missing_parts()
    if lacking is not None:
        raise EnforcerError(f"kube-router's firewall cannot run here: {lacking}")
    exe = binary(bin_dir)
    if not exe.exists():
        raise EnforcerError(f"{exe} is not built: run e2e/toolchain/build.sh kube-router")
    _bridge_to_netfilter()
    fd = _take_lock(lock_wait_s)
    log_path = lay.logs / f"{NAME}.log"
    offset = log_path.stat().st_size if log_path.exists() else 0
    try:
        # Whatever a killed kube-router left (no other one runs: we hold the lock).
        firewall.remove_all()
        # The lock travels with kube-router (pass_fds): held exactly as long as it runs.
        # NODE_NAME: it would otherwise look the node up by the host's name first.
        env = {**os.environ, "NODE_NAME": node}
        pid = processes.spawn(NAME, argv(exe, lay, node), lay.pids, lay.logs, env, pass_fds=(fd,))
    finally:
        os.close(fd)
    try:
        _wait_synced(lay, offset)
    except EnforcerError:
        stop(lay)
        raise
    return pid


def _wait_synced(lay: Layout, offset: int) -> None:
    """Up when it has written its rules once: its top-level chains and a finished sync."""
    spawned = time.monotonic()
    deadline = spawned + START_TIMEOUT_S
    log = lay.logs / f"{NAME}.log"
    while time.monotonic() < deadline:
        # The first moments are exec's: the kernel reports the new command line only
        # once it has loaded the binary (59 MB), after Popen has already returned.
        if not running(lay) and time.monotonic() - spawned > EXEC_GRACE_S:
            raise EnforcerError(f"kube-router exited\n{processes.exit_status_hint(lay.logs, NAME)}")
        with log.open("rb") as fh:
            fh.seek(offset)
            text = fh.read().decode(errors="replace")
        if "Aborting sync" in text:
            hint = processes.exit_status_hint(lay.logs, NAME)
            raise EnforcerError(f"kube-router could not write its rules\n{hint}")
        chains = firewall.owned_chains(firewall.save_filter())
        if "sync iptables took" in text and set(firewall.TOP_CHAINS) <= set(chains):
            return
        time.sleep(0.2)
    raise EnforcerError(
        f"kube-router not synced in {START_TIMEOUT_S:.0f}s\n"
        f"{processes.exit_status_hint(lay.logs, NAME)}"
    )


def stop(lay: Layout) -> None:
    """Stop this slot's kube-router by PID, then remove every rule and ipset it made.

    kube-router leaves its rules in place when it exits (so a restart keeps
    enforcing); with it gone the lock is free and the removal runs under it.
    If another slot took the lock in between, that slot's kube-router owns
    the names now and removed our leftovers when it started.
    """
    had_one = (lay.pids / f"{NAME}.json").exists()
    processes.stop(lay.pids, NAME, grace_s=15.0)
    if not had_one:
        return
    fd = _try_lock()
    if fd is None:
        return
    try:
        firewall.remove_all()
    finally:
        os.close(fd)
