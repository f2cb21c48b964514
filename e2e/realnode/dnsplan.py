"""The real node's cluster DNS: CoreDNS's address, Corefile and RBAC (pure).

Where it sits: beside ``e2e.realnode.plan`` (the node's own configs), read
by ``e2e.realnode.dns``, which signs CoreDNS's client certificate, applies
the RBAC, writes the Corefile and starts the process. CoreDNS runs as a
process of the harness, not as a pod: there is no kube-proxy, so a Service
address would not reach it, and the node's pods reach the bridge's own
address directly.

- Address: the slot's bridge address (``GATEWAY_IP``, also the node's
  InternalIP), port 53. The kubelet's ``clusterDNS`` names it, so pods with
  the default ``ClusterFirst`` policy get it as their only nameserver.
- One zone, the cluster domain. CoreDNS answers REFUSED for a name in no
  zone it serves, and the binary has no ``forward`` plugin
  (``e2e/toolchain/coredns/main.go``): no name ever resolves through the
  machine's own resolver, no query leaves the machine.
- The ``kubernetes`` plugin reads the local API server with its own client
  certificate (``torchflex:realnode-coredns``), bound to a ClusterRole with
  list/watch on what the plugin watches.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from e2e.cluster.layout import CLUSTER_DOMAIN, GATEWAY_IP, SLOT
from e2e.realnode.plan import NodePaths
from e2e.toolchain.versions import COREDNS_VERSION

DNS_IP: Final = GATEWAY_IP
DNS_PORT: Final = 53
CERT_NAME: Final = "realnode-coredns"  # in the cluster's pki dir, signed by its CA
USER: Final = "torchflex:realnode-coredns"
RBAC_NAME: Final = f"torchflex:realnode-coredns-{SLOT}"
# What `coredns -plugins` must list: the ones main.go links and those they
# pull in. Any other (forward above all) means a different build.
PLUGINS: Final = frozenset({"bind", "errors", "kubernetes", "log", "metadata", "ready", "transfer"})
# Answer TTL: short, so a replaced store pod's new address is seen soon.
TTL_S: Final = 5


def coredns_binary(bin_dir: Path) -> Path:
    return bin_dir / f"coredns-{COREDNS_VERSION}"


def corefile_path(p: NodePaths) -> Path:
    return p.root / "Corefile"


def kubeconfig_path(p: NodePaths) -> Path:
    return p.root / "coredns.kubeconfig"


def corefile(kubeconfig: Path, ready_port: int) -> str:
    """One server block for the cluster domain on the bridge address only."""
    return f"""{CLUSTER_DOMAIN}:{DNS_PORT} {{
    bind {DNS_IP}
    ready 127.0.0.1:{ready_port}
    errors
    log
    kubernetes {CLUSTER_DOMAIN} {{
        kubeconfig {kubeconfig}
        pods disabled
        ttl {TTL_S}
    }}
}}
"""


def coredns_argv(bin_dir: Path, p: NodePaths) -> list[str]:
    return [str(coredns_binary(bin_dir)), "-conf", str(corefile_path(p))]


def rbac_manifests() -> list[dict[str, Any]]:
    """The ClusterRole the kubernetes plugin needs (list/watch of Services,
    EndpointSlices, Namespaces, Pods) bound to CoreDNS's certificate user."""
    role: dict[str, Any] = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": RBAC_NAME},
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["services", "namespaces", "pods"],
                "verbs": ["list", "watch"],
            },
            {
                "apiGroups": ["discovery.k8s.io"],
                "resources": ["endpointslices"],
                "verbs": ["list", "watch"],
            },
        ],
    }
    binding: dict[str, Any] = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": RBAC_NAME},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": RBAC_NAME,
        },
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
    }
    return [role, binding]
