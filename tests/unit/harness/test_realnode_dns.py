"""The real node's cluster DNS plan (e2e.realnode.dnsplan), pure: checked in
`make test` without CoreDNS, containerd or a kubelet.

CoreDNS listens on the slot's bridge address only and serves the cluster
domain only; neither its Corefile nor its build has a way to send a query
anywhere else (no ``forward``); the kubelet points pods at it; its RBAC
reads and never writes.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

import yaml

from e2e.cluster.layout import CLUSTER_DOMAIN, GATEWAY_IP, POD_PREFIX_LEN, POD_SUBNET_PREFIX
from e2e.realnode import dnsplan, plan
from e2e.toolchain.versions import COREDNS_VERSION

BRIDGE_NET = ipaddress.IPv4Network(f"{POD_SUBNET_PREFIX}.0.0/{POD_PREFIX_LEN}")
COREDNS_SRC = Path(__file__).resolve().parents[3] / "e2e" / "toolchain" / "coredns"


def _blocks(corefile: str) -> dict[str, list[str]]:
    """Top-level server blocks: their key -> the first word of each line inside."""
    out: dict[str, list[str]] = {}
    depth, key = 0, ""
    for line in corefile.splitlines():
        words = line.split()
        if not words:
            continue
        if depth == 0 and words[-1] == "{":
            key = words[0]
            out[key] = []
        elif depth == 1 and words[0] != "}":
            out[key].append(words[0])
        depth += line.count("{") - line.count("}")
    assert depth == 0, corefile
    return out


def test_corefile_serves_only_the_cluster_domain_on_the_bridge(tmp_path: Path) -> None:
    text = dnsplan.corefile(tmp_path / "kubeconfig", 4242)
    blocks = _blocks(text)
    assert list(blocks) == [f"{CLUSTER_DOMAIN}:53"]  # any other name: REFUSED
    assert blocks[f"{CLUSTER_DOMAIN}:53"] == ["bind", "ready", "errors", "log", "kubernetes"]
    assert f"bind {dnsplan.DNS_IP}\n" in text
    assert ipaddress.IPv4Address(dnsplan.DNS_IP) in BRIDGE_NET
    assert dnsplan.DNS_IP == GATEWAY_IP == plan.NODE_IP
    assert "ready 127.0.0.1:4242\n" in text
    assert f"kubernetes {CLUSTER_DOMAIN} {{" in text
    assert f"kubeconfig {tmp_path / 'kubeconfig'}\n" in text
    assert not re.search(r"\b(forward|proxy|resolv\.conf)\b", text)


def test_the_build_links_no_plugin_that_sends_queries_elsewhere() -> None:
    main_go = (COREDNS_SRC / "main.go").read_text()
    linked = set(re.findall(r'"github\.com/coredns/coredns/plugin/(\w+)"', main_go))
    assert linked == {"bind", "errors", "kubernetes", "log", "ready"}
    directives = re.search(r"Directives = \[\]string\{([^}]*)\}", main_go)
    assert directives is not None
    assert re.findall(r'"(\w+)"', directives.group(1)) == [
        "bind", "ready", "errors", "log", "kubernetes",
    ]  # fmt: skip
    assert linked <= dnsplan.PLUGINS
    assert not {"forward", "grpc", "etcd", "route53", "clouddns", "azure"} & dnsplan.PLUGINS
    go_mod = (COREDNS_SRC / "go.mod").read_text()
    assert f"github.com/coredns/coredns {COREDNS_VERSION}\n" in go_mod


def test_kubelet_points_pods_at_the_cluster_dns(tmp_path: Path) -> None:
    p = plan.NodePaths.of(tmp_path)
    kubelet = yaml.safe_load(
        plan.kubelet_config_yaml(
            p, tmp_path / "ca", tmp_path / "crt", tmp_path / "key", healthz_port=1, port=2
        )
    )
    assert kubelet["clusterDNS"] == [dnsplan.DNS_IP]
    assert kubelet["clusterDomain"] == CLUSTER_DOMAIN
    assert kubelet["resolvConf"] == ""  # no host nameserver or search list in pods


def test_files_and_argv_stay_in_the_nodes_directory(tmp_path: Path) -> None:
    p = plan.NodePaths.of(tmp_path)
    argv = dnsplan.coredns_argv(tmp_path / "bin", p)
    assert argv == [
        str(tmp_path / "bin" / f"coredns-{COREDNS_VERSION}"),
        "-conf",
        str(dnsplan.corefile_path(p)),
    ]
    for path in (dnsplan.corefile_path(p), dnsplan.kubeconfig_path(p)):
        assert path.is_relative_to(p.root)


def test_rbac_lets_coredns_read_and_nothing_else() -> None:
    role, binding = dnsplan.rbac_manifests()
    assert role["kind"] == "ClusterRole"
    granted = {
        (group, resource)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert granted == {
        ("", "services"),
        ("", "namespaces"),
        ("", "pods"),
        ("discovery.k8s.io", "endpointslices"),
    }
    assert all(rule["verbs"] == ["list", "watch"] for rule in role["rules"])
    assert binding["roleRef"]["name"] == role["metadata"]["name"] == dnsplan.RBAC_NAME
    assert binding["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": dnsplan.USER}
    ]
