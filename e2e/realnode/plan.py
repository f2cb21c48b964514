"""Where a real node's parts live and what their config files say (pure).

Where it sits: read by ``e2e.realnode.node``, which writes these texts and
starts the daemons. Everything is keyed by the cluster slot, beside the
embedded flavor's plan in ``e2e.cluster.layout``:

- State under ``<cluster state dir>/realnode/`` (containerd root and state,
  its socket, the kubelet's root dir, CNI config and IPAM data, logs).
- Addresses: pods get ``<pod prefix>.240.2-254`` on the slot's own bridge
  (``tfbr<slot>``, the embedded pods' /16; the process kubelet hands out
  addresses from the bottom of that range). The node's address is the
  bridge's own (the gateway): a kubelet refuses a loopback node IP, and
  that address is one the harness assigned on its own bridge. Pods get no
  default route: nothing leaves the bridge.
- Cgroups under ``/torchflex-realnode<slot>`` in every v1 hierarchy.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any, Final

import yaml

from e2e.cluster.layout import (
    BRIDGE,
    CLUSTER_DOMAIN,
    GATEWAY_IP,
    POD_PREFIX_LEN,
    POD_SUBNET_PREFIX,
    SLOT,
)
from e2e.toolchain.versions import PAUSE_VERSION, VERSIONS

NODE_NAME: Final = f"realnode-{SLOT}-0"
NODE_IP: Final = GATEWAY_IP
NODE_LABEL: Final = "torchflex.io/real-node"
CGROUP_ROOT: Final = f"/torchflex-realnode{SLOT}"
POD_RANGE_START: Final = f"{POD_SUBNET_PREFIX}.240.2"
POD_RANGE_END: Final = f"{POD_SUBNET_PREFIX}.240.254"
CNI_BIN_DIR: Final = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
RUNC: Final = "/usr/sbin/runc"
# containerd's CRI plugin runs this image as every pod's sandbox; it is
# imported from the tarball built here, so the name is never pulled.
PAUSE_IMAGE: Final = f"registry.k8s.io/pause:{PAUSE_VERSION}"
# A tag may hold only [A-Za-z0-9_.-]: Debian's epoch and '+' become '-'.
BUSYBOX_IMAGE: Final = "torchflex.local/busybox:" + re.sub(
    r"[^A-Za-z0-9_.-]", "-", VERSIONS["BUSYBOX_DEB_VERSION"]
)
CRI_NAMESPACE: Final = "k8s.io"


@dataclasses.dataclass(frozen=True)
class NodePaths:
    """Every file and directory of one real node, under the cluster's state dir."""

    root: Path

    @classmethod
    def of(cls, cluster_root: Path) -> NodePaths:
        return cls(cluster_root / "realnode")

    @property
    def containerd_root(self) -> Path:
        return self.root / "containerd" / "root"

    @property
    def containerd_state(self) -> Path:
        return self.root / "containerd" / "state"

    @property
    def containerd_config(self) -> Path:
        return self.root / "containerd.toml"

    @property
    def socket(self) -> Path:
        return self.root / "containerd.sock"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni" / "net.d"

    @property
    def cni_ipam_dir(self) -> Path:
        return self.root / "cni" / "ipam"

    @property
    def kubelet_root(self) -> Path:
        return self.root / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet-config.yaml"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubelet.kubeconfig"

    @property
    def images(self) -> Path:
        return self.root / "images"

    @property
    def registry_hosts(self) -> Path:
        """containerd's ``config_path``: one ``<host:port>/hosts.toml`` per registry."""
        return self.root / "certs.d"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"

    @property
    def pids(self) -> Path:
        return self.root / "pids"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def dirs(self) -> list[Path]:
        return [
            self.containerd_root, self.containerd_state, self.cni_conf_dir, self.cni_ipam_dir,
            self.kubelet_root, self.images, self.pod_logs, self.pids, self.logs,
            self.registry_hosts, self.root / "volume-plugins", self.root / "containerd" / "opt",
        ]  # fmt: skip


def containerd_toml(p: NodePaths) -> str:
    """containerd 1.6 config (version 2): own root, state, sockets; CRI on cgroupfs."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{p.containerd_root}"
state = "{p.containerd_state}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]

[grpc]
  address = "{p.socket}"

[ttrpc]
  address = "{p.socket}.ttrpc"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{p.root / "containerd" / "opt"}"

[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  # This machine denies lowering oom_score_adj (runc dies with "can't get
  # final child's PID"); clamp pods' scores to containerd's own instead.
  restrict_oom_score_adj = true
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        BinaryName = "{RUNC}"
        SystemdCgroup = false
  [{cri}.registry]
    # Read at each pull: the local registry's hosts.toml (plain HTTP on
    # loopback) is written when it starts, after containerd.
    config_path = "{p.registry_hosts}"
  [{cri}.cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{p.cni_conf_dir}"
    max_conf_num = 1
"""


def registry_config_yaml(data_dir: Path, address: str) -> str:
    """The distribution registry's config: filesystem storage under the slot's
    state dir, plain HTTP on ``address`` (loopback), no debug server."""
    conf: dict[str, Any] = {
        "version": 0.1,
        "log": {"level": "info", "accesslog": {"disabled": False}},
        "storage": {"filesystem": {"rootdirectory": str(data_dir)}, "delete": {"enabled": True}},
        "http": {"addr": address},
    }
    return yaml.safe_dump(conf, sort_keys=False)


def registry_hosts_toml(address: str) -> str:
    """containerd's hosts.toml for the local registry at ``host:port``: plain
    HTTP (the registry listens on loopback only), pull and resolve."""
    return f"""server = "http://{address}"

[host."http://{address}"]
  capabilities = ["pull", "resolve"]
"""


def cni_conflist(p: NodePaths) -> str:
    """The bridge plugin on the harness's bridge; host-local hands out the
    node's slice of the bridge's /16; no routes beyond the bridge subnet."""
    subnet = f"{POD_SUBNET_PREFIX}.0.0/{POD_PREFIX_LEN}"
    conf: dict[str, Any] = {
        "cniVersion": "1.0.0",
        "name": f"torchflex-realnode{SLOT}",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                # The bridge and its address belong to e2e.cluster.network.
                "isGateway": False,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(p.cni_ipam_dir),
                    "ranges": [
                        [
                            {
                                "subnet": subnet,
                                "rangeStart": POD_RANGE_START,
                                "rangeEnd": POD_RANGE_END,
                                "gateway": GATEWAY_IP,
                            }
                        ]
                    ],
                    "routes": [],
                },
            }
        ],
    }
    return json.dumps(conf, indent=2) + "\n"


def kubelet_config_yaml(
    p: NodePaths, ca: Path, cert: Path, key: Path, *, healthz_port: int, port: int
) -> str:
    """KubeletConfiguration: cgroup v1 allowed, cgroupfs driver, x509 + webhook
    auth, and eviction/image GC thresholds low enough for a shared disk."""
    conf: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # This machine has cgroup v1 only; 1.35+ refuses it unless told.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": CGROUP_ROOT,
        "containerRuntimeEndpoint": f"unix://{p.socket}",
        "address": NODE_IP,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "tlsCertFile": str(cert),
        "tlsPrivateKeyFile": str(key),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca)},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDomain": CLUSTER_DOMAIN,
        # CoreDNS on the bridge address (e2e.realnode.dnsplan): pods with the
        # default ClusterFirst policy get it as their only nameserver; an
        # empty resolvConf keeps the host's resolvers and search list out.
        "clusterDNS": [NODE_IP],
        "resolvConf": "",
        "failSwapOn": False,
        "podLogsDir": str(p.pod_logs),
        "volumePluginDir": str(p.root / "volume-plugins"),
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        # The locally imported images can never be pulled again: never GC them.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "rotateCertificates": False,
        "serializeImagePulls": True,
    }
    return yaml.safe_dump(conf, sort_keys=False)


def kubelet_argv(bin_dir: Path, p: NodePaths) -> list[str]:
    return [
        str(bin_dir / "kubelet"),
        f"--config={p.kubelet_config}",
        f"--kubeconfig={p.kubeconfig}",
        f"--root-dir={p.kubelet_root}",
        f"--hostname-override={NODE_NAME}",
        f"--node-ip={NODE_IP}",
        f"--node-labels={NODE_LABEL}=true",
        "--v=1",
    ]


def containerd_argv(p: NodePaths) -> list[str]:
    return ["/usr/bin/containerd", f"--config={p.containerd_config}"]
