"""The harness bridge and per-pod network namespaces (iproute2).

Where it sits: ``lifecycle`` creates and deletes the bridge; the process
kubelet calls :func:`create_pod_netns` / :func:`delete_pod_netns` for each
pod. Pods get an address on the bridge and a route for the bridge subnet
only: no default route, so nothing they do can leave the bridge. The kubelet
has a new pod announce its address with :func:`announce` (gratuitous ARP, as
the CNI bridge plugin does), because pod addresses are reused and peers
would otherwise keep sending to the old pod's MAC. ``e2e.kubelet.faults`` cuts and restores a
pod's link with :func:`set_pod_link`.
"""

from __future__ import annotations

import ctypes
import hashlib
import ipaddress
import socket
import struct
import subprocess
import threading

from e2e.cluster.layout import (
    BRIDGE,
    GATEWAY_IP,
    NETNS_PREFIX,
    POD_PREFIX_LEN,
    POD_SUBNET_PREFIX,
)


class NetworkError(RuntimeError):
    """An iproute2 command failed."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and out.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {out.stderr.strip()}")
    return out


def bridge_exists() -> bool:
    return _ip("link", "show", BRIDGE, check=False).returncode == 0


def ensure_bridge() -> None:
    if not bridge_exists():
        _ip("link", "add", BRIDGE, "type", "bridge")
        _ip("addr", "add", f"{GATEWAY_IP}/{POD_PREFIX_LEN}", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")


def delete_bridge() -> None:
    if bridge_exists():
        _ip("link", "del", BRIDGE)


def netns_name(pod_uid: str) -> str:
    return f"{NETNS_PREFIX}{pod_uid[:13]}"


def veth_name(pod_uid: str) -> str:
    """The host side of a pod's veth pair (its port on the bridge)."""
    # Interface names are limited to 15 characters.
    return "tfv" + hashlib.sha1(pod_uid.encode()).hexdigest()[:11]


def pod_ip_for(index: int) -> str:
    """Address number ``index`` (>= 2) in the pod subnet."""
    base = ipaddress.ip_address(f"{POD_SUBNET_PREFIX}.0.0")
    return str(base + index)


def pod_ip_index(ip: str) -> int | None:
    """The inverse of :func:`pod_ip_for` (None: not a pod address of this slot)."""
    base = ipaddress.ip_address(f"{POD_SUBNET_PREFIX}.0.0")
    try:
        index = int(ipaddress.ip_address(ip)) - int(base)
    except ValueError:
        return None
    return index if 2 <= index < 2**16 - 1 else None


def create_pod_netns(pod_uid: str, ip: str) -> str:
    """Create the namespace, veth pair and address; returns the netns name."""
    ns, veth = netns_name(pod_uid), veth_name(pod_uid)
    delete_pod_netns(pod_uid)
    _ip("netns", "add", ns)
    _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
    _ip("link", "set", veth, "master", BRIDGE)
    _ip("link", "set", veth, "up")
    _ip("-n", ns, "addr", "add", f"{ip}/{POD_PREFIX_LEN}", "dev", "eth0")
    _ip("-n", ns, "link", "set", "eth0", "up")
    _ip("-n", ns, "link", "set", "lo", "up")
    return ns


def delete_pod_netns(pod_uid: str) -> None:
    _ip("link", "del", veth_name(pod_uid), check=False)
    _ip("netns", "del", netns_name(pod_uid), check=False)


def delete_netns(name: str) -> None:
    """Deleting a namespace also destroys the veth pair inside it."""
    _ip("netns", "del", name, check=False)


def list_pod_netns() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(NETNS_PREFIX)]


def set_pod_link(pod_uid: str, up: bool) -> None:
    """Take a pod's bridge port down or up: the pod keeps its address and
    routes but nothing passes, like a pulled cable (no RST, no error)."""
    _ip("link", "set", veth_name(pod_uid), "up" if up else "down")


def pod_link_up(pod_uid: str) -> bool:
    out = _ip("-o", "link", "show", veth_name(pod_uid)).stdout
    flags = out.split("<", 1)[1].split(">", 1)[0].split(",") if "<" in out else []
    return "UP" in flags


ARP_REQUEST = 1
ARP_REPLY = 2
_ETH_P_ARP = 0x0806
_CLONE_NEWNET = 0x40000000


def garp_frame(mac: bytes, ip: str, op: int) -> bytes:
    """A gratuitous ARP frame: ``ip`` is at ``mac``, broadcast to the segment.

    Sender and target address are both ``ip``; Linux peers update an entry
    they already hold for it (``arp_accept`` only governs new entries).
    """
    if len(mac) != 6:
        raise ValueError(f"a MAC address has 6 bytes, got {len(mac)}")
    addr = socket.inet_aton(ip)
    broadcast = b"\xff" * 6
    eth = broadcast + mac + struct.pack("!H", _ETH_P_ARP)
    target_mac = b"\x00" * 6 if op == ARP_REQUEST else broadcast
    arp = struct.pack("!HHBBH", 1, 0x0800, 6, 4, op) + mac + addr + target_mac + addr
    return eth + arp


def announce(netns: str, ip: str, device: str = "eth0") -> None:
    """Send gratuitous ARP (request and reply form) for ``ip`` from inside ``netns``.

    A thread of our own enters the namespace (``setns`` moves only the
    calling thread) and ends there, so the rest of the process never
    changes namespace. No ``arping`` binary needed.
    """
    failure: list[BaseException] = []

    def run() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            with open(f"/run/netns/{netns}", "rb") as fh:
                if libc.setns(fh.fileno(), _CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns {netns}")
            with socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(_ETH_P_ARP)) as s:
                s.bind((device, _ETH_P_ARP))
                mac = s.getsockname()[4]
                for op in (ARP_REQUEST, ARP_REPLY):
                    s.send(garp_frame(mac, ip, op))
        except OSError as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, name=f"garp-{netns}", daemon=True)
    thread.start()
    thread.join(timeout=5)
    if failure:
        raise NetworkError(f"gratuitous ARP for {ip} in {netns}: {failure[0]}")
