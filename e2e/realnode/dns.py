"""Start and stop the real node's cluster DNS (CoreDNS as a harness process).

Where it sits: called by ``e2e.realnode.node`` (``real_node_up`` starts it
before the kubelet, whose ``clusterDNS`` points at it; ``real_node_down``
stops it). ``e2e.realnode.dnsplan`` decides the address, Corefile and RBAC;
this module signs CoreDNS's client certificate with the cluster CA, applies
the RBAC, writes the files, starts the process by PID (``e2e.cluster.processes``,
recorded under the node's ``pids``) and waits until its ``ready`` endpoint
says the kubernetes plugin has synced with the API server.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

from e2e.cluster import processes
from e2e.cluster.handle import Cluster
from e2e.cluster.pki import _sign, kubeconfig_yaml
from e2e.localproc import free_port
from e2e.polling import poll_until
from e2e.realnode import dnsplan
from e2e.realnode.plan import NodePaths

PROCESS = "coredns"


class ClusterDNSError(RuntimeError):
    """CoreDNS did not become ready; the message has its log tail."""


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _ready_port(p: NodePaths) -> int | None:
    """The ready port of the Corefile CoreDNS was started with, if any."""
    path = dnsplan.corefile_path(p)
    if not path.exists():
        return None
    for line in path.read_text().splitlines():
        words = line.split()
        if words[:1] == ["ready"]:
            return int(words[1].rpartition(":")[2])
    return None


def dns_up(cluster: Cluster, p: NodePaths, bin_dir: Path, timeout_s: float = 60.0) -> None:
    """Start (or reuse) this slot's CoreDNS; returns once it serves the cluster domain."""
    pki = cluster.layout.pki
    if not (pki / f"{dnsplan.CERT_NAME}.crt").exists():
        ext = (
            "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=clientAuth\n"
        )
        _sign(pki, dnsplan.CERT_NAME, f"/CN={dnsplan.USER}", ext)
    items = {"apiVersion": "v1", "kind": "List", "items": dnsplan.rbac_manifests()}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(items))
    port = _ready_port(p)
    if port is None or not processes.alive(p.pids, PROCESS):
        server = f"https://127.0.0.1:{cluster.info['ports']['apiserver']}"
        dnsplan.kubeconfig_path(p).write_text(kubeconfig_yaml(server, pki, dnsplan.CERT_NAME))
        port = free_port()
        dnsplan.corefile_path(p).write_text(dnsplan.corefile(dnsplan.kubeconfig_path(p), port))
        processes.spawn(PROCESS, dnsplan.coredns_argv(bin_dir, p), p.pids, p.logs)
    if not poll_until(lambda: _ready(f"http://127.0.0.1:{port}/ready"), timeout_s, interval_s=0.2):
        raise ClusterDNSError(
            "CoreDNS did not become ready\n" + processes.exit_status_hint(p.logs, PROCESS, 40)
        )


def dns_down(p: NodePaths, cluster: Cluster | None = None) -> None:
    """Stop CoreDNS by its recorded PID and remove its RBAC (the certificate
    stays in the cluster's pki, which goes with the cluster)."""
    processes.stop(p.pids, PROCESS)
    if cluster is not None and cluster.ready():
        for manifest in dnsplan.rbac_manifests():
            cluster.kubectl(
                "delete", manifest["kind"].lower(), manifest["metadata"]["name"],
                "--ignore-not-found", "--wait=false",
            )  # fmt: skip
