"""Bring a real node up beside a running local control plane, and take it down.

Where it sits: the acting layer of ``e2e.realnode`` (``plan`` decides every
name, address and config text). :func:`real_node_up` signs the node's
certificates with the cluster's CA, writes the configs, creates the node's
cgroup root, starts containerd, the cluster DNS (``e2e.realnode.dns``) and
the kubelet through
``e2e.cluster.processes`` (recorded by PID under ``realnode/pids``),
imports the locally built images and waits for the Node to be Ready.
:func:`real_node_down` undoes all of it by PID and by path: the kubelet,
CoreDNS and its RBAC, every task in our containerd, containerd itself, the pods' network
namespaces, mounts under the node's directory, its cgroups, the Node object.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

from e2e.cluster import processes
from e2e.cluster.handle import Cluster
from e2e.cluster.pki import _sign, kubeconfig_yaml
from e2e.localproc import free_port
from e2e.polling import poll_until
from e2e.realnode import images, plan
from e2e.realnode.dns import dns_down, dns_up
from e2e.realnode.plan import NODE_IP, NODE_NAME, NodePaths
from e2e.realnode.registry import ImagesPaths, registry_down
from e2e.toolchain.versions import PAUSE_VERSION

CGROUP_MOUNT = Path("/sys/fs/cgroup")
CLIENT_CERT = "realnode-client"  # in the cluster's pki dir, signed by its CA
SERVING_CERT = "realnode-serving"


class RealNodeError(RuntimeError):
    """A part of the real node did not come up; the message has its log tail."""


@dataclasses.dataclass(frozen=True)
class RealNode:
    cluster: Cluster
    paths: NodePaths
    name: str = NODE_NAME


def realnode_bin_dir() -> Path:
    """The pinned binaries a real node and its cluster run: the control plane, helm,
    the kubelet, pause, CoreDNS, the registry (built if missing; progress on stderr)."""
    build = Path(__file__).resolve().parents[1] / "toolchain" / "build.sh"
    out = subprocess.run(
        ["bash", str(build), "control-plane", "tools", "real-nodes"],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    return Path(out.stdout.strip().splitlines()[-1])


def _ctr(p: NodePaths, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = ["ctr", "--address", str(p.socket), "--namespace", plan.CRI_NAMESPACE, *args]
    out = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    if check and out.returncode != 0:
        raise RealNodeError(f"{' '.join(argv)}: {out.stderr.strip()}")
    return out


def _certs(pki: Path) -> None:
    """The node's client identity (Node authorizer: system:node:<name> in
    system:nodes) and its serving certificate for the API server's dials."""
    usage = "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
    if not (pki / f"{CLIENT_CERT}.crt").exists():
        subject = f"/O=system:nodes/CN=system:node:{NODE_NAME}"
        _sign(pki, CLIENT_CERT, subject, usage + "extendedKeyUsage=clientAuth\n")
    if not (pki / f"{SERVING_CERT}.crt").exists():
        san = f"subjectAltName=IP:{NODE_IP},DNS:{NODE_NAME}\n"
        _sign(pki, SERVING_CERT, f"/CN={NODE_NAME}", usage + "extendedKeyUsage=serverAuth\n" + san)


def _cgroup_hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy once (cpu and cpuacct may be links to
    one), with the hybrid layout's controller-less v2 ``unified`` one too:
    runc makes the pods' cgroups there as well."""
    seen: dict[Path, Path] = {}
    for entry in sorted(CGROUP_MOUNT.iterdir()):
        if (entry / "cgroup.procs").exists():
            seen.setdefault(entry.resolve(), entry)
    return list(seen.values())


def _create_cgroup_root() -> None:
    for hierarchy in _cgroup_hierarchies():
        node = hierarchy / plan.CGROUP_ROOT.lstrip("/")
        node.mkdir(exist_ok=True)
        # A new cpuset starts with no CPUs and no memory nodes; give it the parent's.
        for knob in ("cpuset.cpus", "cpuset.mems"):
            if (node / knob).exists() and not (node / knob).read_text().strip():
                (node / knob).write_text((hierarchy / knob).read_text())


def _remove_cgroup_root() -> bool:
    """rmdir the node's cgroups deepest first; False while one is still busy."""
    done = True
    for hierarchy in _cgroup_hierarchies():
        top = hierarchy / plan.CGROUP_ROOT.lstrip("/")
        if not top.exists():
            continue
        subs = sorted((d for d in top.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts))
        for d in [*subs, top]:
            try:
                d.rmdir()
            except OSError:
                done = False
    return done


def _write_configs(cluster: Cluster, p: NodePaths) -> None:
    for d in p.dirs():
        d.mkdir(parents=True, exist_ok=True)
    pki = cluster.layout.pki
    _certs(pki)
    server = f"https://127.0.0.1:{cluster.info['ports']['apiserver']}"
    p.kubeconfig.write_text(kubeconfig_yaml(server, pki, CLIENT_CERT))
    p.containerd_config.write_text(plan.containerd_toml(p))
    (p.cni_conf_dir / "10-torchflex.conflist").write_text(plan.cni_conflist(p))
    p.kubelet_config.write_text(
        plan.kubelet_config_yaml(
            p, pki / "ca.crt", pki / f"{SERVING_CERT}.crt", pki / f"{SERVING_CERT}.key",
            healthz_port=free_port(), port=free_port(),
        )
    )  # fmt: skip


def _start(p: NodePaths, name: str, argv: list[str]) -> None:
    if not processes.alive(p.pids, name):
        processes.spawn(name, argv, p.pids, p.logs)


def _import_images(bin_dir: Path, p: NodePaths) -> None:
    specs = [
        images.pause_spec(bin_dir / f"pause-{PAUSE_VERSION}"),
        images.busybox_spec(Path("/bin/busybox")),
    ]
    for spec in specs:
        archive = p.images / (spec.name.replace("/", "_").replace(":", "_") + ".tar")
        images.write_oci_archive(spec, archive)
        _ctr(p, "images", "import", str(archive))


def real_node_up(cluster: Cluster, ready_timeout_s: float = 180.0) -> RealNode:
    """Start (or reuse) the real node of this slot; returns when it is Ready."""
    p = NodePaths.of(cluster.layout.root)
    bin_dir = realnode_bin_dir()
    _write_configs(cluster, p)
    _create_cgroup_root()
    _start(p, "containerd", plan.containerd_argv(p))
    if not poll_until(lambda: _ctr(p, "version", check=False).returncode == 0, 30.0):
        raise RealNodeError(
            "containerd did not answer\n" + processes.exit_status_hint(p.logs, "containerd")
        )
    _import_images(bin_dir, p)
    dns_up(cluster, p, bin_dir)  # before the kubelet: its clusterDNS names it
    _start(p, "kubelet", plan.kubelet_argv(bin_dir, p))
    try:
        cluster.wait_nodes_ready([NODE_NAME], ready_timeout_s)
    except TimeoutError as exc:
        raise RealNodeError(f"{exc}\n" + processes.exit_status_hint(p.logs, "kubelet", 40)) from exc
    return RealNode(cluster, p)


def _sandbox_netns(p: NodePaths, ids: list[str]) -> list[str]:
    """The network namespaces (bind-mount paths) our containers were given."""
    out: list[str] = []
    for cid in ids:
        info = _ctr(p, "containers", "info", cid, check=False)
        if info.returncode != 0:
            continue
        spec = json.loads(info.stdout).get("Spec") or {}
        for ns in spec.get("linux", {}).get("namespaces", []):
            if ns.get("type") == "network" and ns.get("path", "").startswith("/var/run/netns/"):
                out.append(ns["path"])
    return out


def _stop_tasks(p: NodePaths) -> list[str]:
    """Kill and delete every task in our containerd; returns their netns paths."""
    ids = _ctr(p, "containers", "list", "--quiet", check=False).stdout.split()
    netns = _sandbox_netns(p, ids)
    for cid in ids:
        # --force kills a running task first; the shim exits with it.
        _ctr(p, "tasks", "delete", "--force", cid, check=False)
    return netns


def _our_shims(p: NodePaths) -> list[int]:
    """Shim processes serving our containerd (found by their -address argument)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"containerd-shim-runc-v2") and str(p.socket).encode() in argv:
            pids.append(int(proc.name))
    return pids


def unmount_under(root: Path) -> None:
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == str(root) or point.startswith(f"{root}/"):
            mounts.append(point)
    for point in sorted(set(mounts), key=lambda m: -m.count("/")):
        subprocess.run(["umount", "--lazy", point], capture_output=True, check=False)


def real_node_down(cluster_root: Path, cluster: Cluster | None = None) -> None:
    """Stop everything :func:`real_node_up` started and remove its state."""
    p = NodePaths.of(cluster_root)
    if not p.root.exists():
        # No real node here: the images folder ($TORCHFLEX_IMAGES_DIR) may be another
        # slot's, in use (make test runs the real-node tier beside the other tiers).
        return
    # The registry's data and buildah's storage stay, for a warm rebuild; the
    # storage's own mounts go (containers/storage mounts them again on use).
    images_paths = ImagesPaths.of(cluster_root)
    registry_down(images_paths)
    unmount_under(images_paths.root)
    processes.stop(p.pids, "kubelet")
    dns_down(p, cluster)
    netns: list[str] = []
    if processes.alive(p.pids, "containerd"):
        netns = _stop_tasks(p)
    shims = _our_shims(p)
    processes.stop(p.pids, "containerd")
    for pid in shims:
        os.kill(pid, signal.SIGKILL)
    for path in netns:
        subprocess.run(["ip", "netns", "delete", Path(path).name], capture_output=True, check=False)
    unmount_under(p.root)
    # A killed pod's last processes leave their cgroups a moment later.
    if not poll_until(_remove_cgroup_root, 15.0, interval_s=0.5):
        raise RealNodeError(f"cgroups under {plan.CGROUP_ROOT} still busy")
    containers_logs = Path("/var/log/containers")
    if containers_logs.is_dir():
        for link in containers_logs.iterdir():
            if link.is_symlink() and str(os.readlink(link)).startswith(str(p.root)):
                link.unlink()
    if cluster is not None and cluster.ready():
        cluster.kubectl("delete", "node", NODE_NAME, "--ignore-not-found", "--wait=false")
    shutil.rmtree(p.root, ignore_errors=True)
