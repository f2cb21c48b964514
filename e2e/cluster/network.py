"""The harness bridge and per-pod network namespaces (iproute2).

Where it sits: ``lifecycle`` creates and deletes the bridge; the process
kubelet calls :func:`create_pod_netns` / :func:`delete_pod_netns` for each
pod. Pods get an address on the bridge and a route for the bridge subnet
only: no default route, so nothing they do can leave the bridge.
"""

from __future__ import annotations

import hashlib
import ipaddress
import subprocess

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


def _veth_name(pod_uid: str) -> str:
    # Interface names are limited to 15 characters.
    return "tfv" + hashlib.sha1(pod_uid.encode()).hexdigest()[:11]


def pod_ip_for(index: int) -> str:
    """Address number ``index`` (>= 2) in the pod subnet."""
    base = ipaddress.ip_address(f"{POD_SUBNET_PREFIX}.0.0")
    return str(base + index)


def create_pod_netns(pod_uid: str, ip: str) -> str:
    """Create the namespace, veth pair and address; returns the netns name."""
    ns, veth = netns_name(pod_uid), _veth_name(pod_uid)
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
    _ip("link", "del", _veth_name(pod_uid), check=False)
    _ip("netns", "del", netns_name(pod_uid), check=False)


def delete_netns(name: str) -> None:
    """Deleting a namespace also destroys the veth pair inside it."""
    _ip("netns", "del", name, check=False)


def list_pod_netns() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(NETNS_PREFIX)]
