"""A real NetworkPolicy enforcer on the local cluster: kube-network-policies.

Where it sits: the process kubelet gives pods their own network namespaces on
the slot's bridge but enforces no NetworkPolicy, so the tenancy test starts
this (``start``) and stops it (``stop``); ``lifecycle.tear_down`` stops it
too, as it does every daemon recorded under ``pids/``. It is not started with
every cluster: NFQUEUE sends the first packet of every new connection to a
selected pod through user space, which the other scenarios and the
benchmarks must not pay for. ``TORCHFLEX_ENFORCE_NETWORK_POLICY=1`` starts it
with the cluster (``make cluster``), for trying policies by hand.

How it sees pod traffic: pods talk over the slot's Linux bridge, which only
hands bridged IPv4 frames to netfilter when asked to; we ask per bridge
(``nf_call_iptables``), never through the machine-wide sysctl. The enforcer
then queues new connections to selected pods' IPs and accepts or drops each
by the policies it reads from our API server.

One at a time per machine: the enforcer always uses the nftables table
``kube-network-policies`` in the host's network namespace, so a second one
(another slot) would flush the first one's rules. A lock file held by the
running enforcer itself says which slot has it; ``start`` in another slot
fails naming that slot. The enforcer runs fail-closed and removes its table
when stopped with SIGTERM.
"""

from __future__ import annotations

import fcntl
import gzip
import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

from e2e.cluster import processes
from e2e.cluster.layout import BRIDGE, SLOT, Layout
from e2e.localproc import free_port
from e2e.toolchain.versions import KUBE_NETWORK_POLICIES_VERSION

NAME = "netpol-enforcer"
LOCK = Path("/run/lock/torchflex-netpol-enforcer.lock")
START_TIMEOUT_S = 60.0
ENV_START_WITH_CLUSTER = "TORCHFLEX_ENFORCE_NETWORK_POLICY"


class EnforcerError(RuntimeError):
    """The enforcer could not start (busy in another slot, or it died)."""


class KernelUnsupportedError(EnforcerError):
    """This kernel cannot run the enforcer's rules (no nftables ``queue`` expression)."""


def kernel_lacks_nft_queue(config: Path = Path("/proc/config.gz")) -> str | None:
    """Why this kernel cannot run the enforcer, or None when it can (or cannot tell).

    The enforcer's rules hand packets to user space with nftables' ``queue``
    expression (``CONFIG_NFT_QUEUE``). The xtables ``NFQUEUE`` target is a
    different module and does not stand in for it; without the expression the
    kernel refuses the whole rule batch with ENOENT.
    """
    try:
        text = gzip.decompress(config.read_bytes()).decode(errors="replace")
    except OSError:
        return None
    options = dict(
        line.split("=", 1)
        for line in text.splitlines()
        if line.startswith("CONFIG_") and "=" in line
    )
    if options.get("CONFIG_NFT_QUEUE") == "y":
        return None
    if options.get("CONFIG_NFT_QUEUE") == "m" and options.get("CONFIG_MODULES") == "y":
        return None
    return (
        "this kernel has no nftables queue expression (CONFIG_NFT_QUEUE is not set"
        + ("" if options.get("CONFIG_MODULES") == "y" else ", and it loads no modules")
        + "), which kube-network-policies needs to pass new connections to user space"
    )


def binary(bin_dir: Path) -> Path:
    return bin_dir / f"kube-network-policies-{KUBE_NETWORK_POLICIES_VERSION}"


def running(lay: Layout) -> bool:
    return processes.alive(lay.pids, NAME)


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


def _take_lock() -> int:
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 4096).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise EnforcerError(
            f"another cluster slot runs the NetworkPolicy enforcer ({holder}); it owns the "
            "host's kube-network-policies nftables table, so only one can run per machine"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps({"slot": SLOT, "pid_of_starter": os.getpid()}).encode())
    return fd


def start(lay: Layout, bin_dir: Path, node: str) -> int:
    """Start the enforcer for this slot's cluster (idempotent); returns its PID."""
    if running(lay):
        return int(json.loads((lay.pids / f"{NAME}.json").read_text())["pid"])
    lacking = kernel_lacks_nft_queue()
    if lacking is not None:
        raise KernelUnsupportedError(lacking)
    exe = binary(bin_dir)
    if not exe.exists():
        raise EnforcerError(f"{exe} is not built: run e2e/toolchain/build.sh")
    _bridge_to_netfilter()
    metrics = free_port()
    argv = [
        str(exe),
        f"--kubeconfig={lay.root / 'admin.kubeconfig'}",
        f"--hostname-override={node}",
        f"--nfqueue-id={100 + SLOT}",
        f"--metrics-bind-address=127.0.0.1:{metrics}",
        # No container runtime here: pod IPs come from the API server (the kubelet
        # reports them before the pod's command starts).
        "--disable-nri",
        # Fail closed: a dead enforcer must not look like a working policy.
        "--fail-open=false",
    ]
    fd = _take_lock()
    log_path = lay.logs / f"{NAME}.log"
    offset = log_path.stat().st_size if log_path.exists() else 0
    try:
        # The lock travels with the enforcer (pass_fds): held exactly as long as it runs.
        pid = processes.spawn(NAME, argv, lay.pids, lay.logs, pass_fds=(fd,))
    finally:
        os.close(fd)
    _wait_synced(lay, metrics, offset)
    return pid


def _wait_synced(lay: Layout, metrics_port: int, offset: int) -> None:
    """Up when its metrics answer and it has written its nftables rules once."""
    deadline = time.monotonic() + START_TIMEOUT_S
    log = lay.logs / f"{NAME}.log"
    while time.monotonic() < deadline:
        if not running(lay):
            raise EnforcerError(
                f"enforcer exited\n{processes.exit_status_hint(lay.logs, NAME, 30)}"
            )
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{metrics_port}/metrics", timeout=2
            ) as resp:
                up = resp.status == 200
        except OSError:
            up = False
        with log.open("rb") as fh:
            fh.seek(offset)
            text = fh.read().decode(errors="replace")
        if "nftables sync failed" in text:
            stop(lay)
            raise EnforcerError(
                f"enforcer could not write its nftables rules\n"
                f"{processes.exit_status_hint(lay.logs, NAME, 30)}"
            )
        if up and "Syncing nftables rules" in text and "elapsed" in text:
            return
        time.sleep(0.2)
    raise EnforcerError(
        f"enforcer not ready in {START_TIMEOUT_S:.0f}s\n"
        f"{processes.exit_status_hint(lay.logs, NAME, 30)}"
    )


def stop(lay: Layout) -> None:
    """SIGTERM (it removes its nftables table when fail-closed), then the lock is free."""
    processes.stop(lay.pids, NAME, grace_s=15.0)
