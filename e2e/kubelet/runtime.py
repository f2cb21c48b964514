"""One pod's runtime on a process node: its state, its record, its name files.

Where it sits: ``agent.Kubelet`` keeps a :class:`PodRuntime` per pod it
runs (address, network namespace, pod directory, container processes and
their status records) and owns every change to it from its single loop
thread. The helpers here act on one runtime only and never call the API
server: writing its ``runtime.json`` (``records``, read by the fault
helpers), its ``/etc/hosts``, ``resolv.conf`` and ``nsswitch.conf``
(``podspec``), killing process groups by PID, finding a container's log
for the log server, and linking the tools images would ship.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from e2e.cluster import network
from e2e.kubelet import logserver, podspec, records, status


@dataclasses.dataclass
class PodRuntime:
    uid: str
    ns: str
    name: str
    node: str
    host_ip: str
    ip_index: int
    netns: str
    pod_dir: Path
    start_time: str
    records: dict[str, status.ContainerRecord]
    procs: dict[str, subprocess.Popen[bytes]] = dataclasses.field(default_factory=dict)
    generation: dict[str, int] = dataclasses.field(default_factory=dict)
    restart_at: dict[str, float] = dataclasses.field(default_factory=dict)
    kill_at: float | None = None
    status_retry_at: float | None = None
    terminating: bool = False
    torn_down: bool = False

    @property
    def ip(self) -> str:
        return network.pod_ip_for(self.ip_index)


def write_record(rt: PodRuntime) -> None:
    containers = {}
    for name, proc in rt.procs.items():
        ident = records.proc_of(proc.pid)
        if ident is not None:
            containers[name] = ident
    record = records.PodRecord(
        uid=rt.uid,
        namespace=rt.ns,
        name=rt.name,
        netns=rt.netns,
        veth=network.veth_name(rt.uid),
        ip=rt.ip,
        containers=containers,
    )
    records.write(rt.pod_dir, record)


# On every pod's PATH (after the system's), standing in for what images ship.
IMAGE_TOOLS = ("etcd",)


def link_image_tools(bin_dir: Path, image_bin: Path) -> None:
    """Images are not run here: the tools an image would have on its PATH
    come from the pinned toolchain (``etcd``, for a managed etcd pod)."""
    image_bin.mkdir(parents=True, exist_ok=True)
    for tool in IMAGE_TOOLS:
        link, target = image_bin / tool, bin_dir / tool
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)


def log_of(
    runtimes: list[PodRuntime], pods_dir: Path, ns: str, pod: str, container: str
) -> tuple[Path, bool] | None:
    """A container's log file for ``kubectl logs`` and whether it still runs."""
    for rt in runtimes:
        if rt.ns == ns and rt.name == pod and container in rt.records:
            return rt.pod_dir / f"{container}.log", container in rt.procs
    # A pod this kubelet process never ran (it finished before a restart).
    path = logserver.newest_log(pods_dir, ns, pod, container)
    return None if path is None else (path, False)


def kill_leftovers(pod_dir: Path) -> None:
    """Processes a previous kubelet process started for this pod and
    left running (it was SIGKILLed): killed by their recorded identity."""
    old = records.read(pod_dir)
    if old is None:
        return
    for proc in old.containers.values():
        if records.is_alive(proc):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


DRAIN_TIMEOUT_S = 5.0


def drain_netns(netns: str, timeout_s: float = DRAIN_TIMEOUT_S) -> list[int]:
    """SIGKILL what still runs in the pod's network namespace once its containers
    exited, and wait (bounded) until it is gone; returns the PIDs found.

    A real runtime reports a container's exit only once every process of its PID
    namespace is gone, so their sockets are closed, FIN or RST sent, while the
    pod's network still exists. Here the main process is reaped at once while a
    torch-sized worker killed with it (in a session of its own) may still be
    tearing down its address space, which comes before its sockets close:
    deleting the veth first leaves its peers on half-open connections (a gloo
    collective with it then waits for its timeout), which no real node does.
    """
    try:
        inode = Path(f"/run/netns/{netns}").stat().st_ino
    except OSError:
        return []
    found: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while True:
        left = _pids_in_netns(inode)
        if not left or time.monotonic() > deadline:
            return sorted(found)
        for pid in left:
            found.add(pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)


def _pids_in_netns(inode: int) -> list[int]:
    """Processes with a thread still in the network namespace ``inode``.

    Every thread, not only the leader: a killed multi-threaded process's leader
    can be through its exit (no namespace left) while other threads still hold
    the process's files, sockets included; a thread leaves the namespace only
    after it dropped its hold on them.
    """
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for task in (entry / "task").iterdir():
                with contextlib.suppress(OSError):
                    if (task / "ns" / "net").stat().st_ino == inode:
                        out.append(int(entry.name))
                        break
    return out


def write_name_files(
    rt: PodRuntime,
    pod: dict[str, Any],
    pods: list[dict[str, Any]],
    services: list[dict[str, Any]],
) -> None:
    """The pod's hosts file (every pod and selector Service it can name),
    resolv.conf and nsswitch.conf (names from /etc/hosts only)."""
    text = podspec.hosts_file(pod, rt.ip, pods, services)
    path = rt.pod_dir / "hosts"
    # Rewritten in place: the file is bind-mounted, a rename would
    # leave the running pod looking at the old inode.
    if not path.exists() or path.read_text() != text:
        with path.open("a+") as fh:
            fh.seek(0)
            fh.truncate()
            fh.write(text)
    resolv = rt.pod_dir / "resolv.conf"
    if not resolv.exists():
        resolv.write_text(podspec.resolv_conf(rt.ns))
    nsswitch = rt.pod_dir / "nsswitch.conf"
    if not nsswitch.exists():
        host = Path("/etc/nsswitch.conf")
        nsswitch.write_text(podspec.nsswitch_conf(host.read_text() if host.exists() else ""))
