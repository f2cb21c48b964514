"""Pure translation of a Pod spec into what a process needs.

Where it sits: the process kubelet's ``agent`` calls these for each container
it starts; unit tests cover them with tables. No API calls here: values that
need the API (tokens, config maps) are passed in already fetched.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from e2e.cluster.layout import CLUSTER_DOMAIN, REPO_ROOT

VENV_BIN = REPO_ROOT / ".venv" / "bin"
BASE_PATH = f"{VENV_BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_UNITS.update({"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40})


class UnsupportedSpecError(ValueError):
    """A pod uses something the process kubelet cannot run; the pod fails."""


def parse_quantity(text: str) -> float:
    """Kubernetes quantity → number (cpu in cores, memory in bytes)."""
    text = str(text)
    if text.endswith("m"):
        return float(text[:-1]) / 1000
    for suffix in sorted(_UNITS, key=len, reverse=True):
        if suffix and text.endswith(suffix):
            return float(text[: -len(suffix)]) * _UNITS[suffix]
    return float(text)


def pod_hostname(pod: Mapping[str, Any]) -> str:
    spec = pod.get("spec", {})
    return str(spec.get("hostname") or pod["metadata"]["name"])[:63]


def metadata_field(pod: Mapping[str, Any], path: str) -> str | None:
    """A ``metadata.*`` fieldRef (name, namespace, uid, one label or annotation
    by key) as env and downward API volume items read it; None: not one of them."""
    meta = pod["metadata"]
    simple = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta.get("namespace", "default"),
        "metadata.uid": meta.get("uid", ""),
    }
    if path in simple:
        return str(simple[path])
    for prefix, source in (("metadata.labels", "labels"), ("metadata.annotations", "annotations")):
        if path.startswith(prefix + "['") and path.endswith("']"):
            key = path[len(prefix) + 2 : -2]
            return str(meta.get(source, {}).get(key, ""))
    return None


def _field_ref(pod: Mapping[str, Any], path: str, node: str, host_ip: str, pod_ip: str) -> str:
    from_meta = metadata_field(pod, path)
    if from_meta is not None:
        return from_meta
    spec = pod.get("spec", {})
    simple = {
        "spec.nodeName": node,
        "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
        "status.hostIP": host_ip,
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
        "status.hostIPs": host_ip,
    }
    if path in simple:
        return str(simple[path])
    raise UnsupportedSpecError(f"fieldRef {path!r} is not supported")


def _resource_ref(container: Mapping[str, Any], ref: Mapping[str, Any]) -> str:
    resource = str(ref["resource"])
    kind, _, name = resource.partition(".")
    value = container.get("resources", {}).get(kind, {}).get(name)
    if value is None and kind == "limits":
        # Unset limits default to node allocatable; report a large cpu count
        # the way a kubelet would and zero for extended resources.
        value = {"cpu": "64", "memory": "256Gi"}.get(name, "0")
    if value is None:
        value = "0"
    divisor = parse_quantity(str(ref.get("divisor", "1")))
    number = parse_quantity(str(value)) / divisor
    # Kubernetes rounds up to the divisor.
    whole = int(number) if number == int(number) else int(number) + 1
    return str(whole)


def container_env(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    *,
    node: str,
    host_ip: str,
    pod_ip: str,
    api_host: str,
    api_port: int,
    config_maps: Mapping[str, Mapping[str, str]],
    secrets: Mapping[str, Mapping[str, str]],
) -> dict[str, str]:
    env: dict[str, str] = {
        "PATH": BASE_PATH,
        "HOME": "/root",
        "HOSTNAME": pod_hostname(pod),
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "KUBERNETES_SERVICE_HOST": api_host,
        "KUBERNETES_SERVICE_PORT": str(api_port),
        "KUBERNETES_SERVICE_PORT_HTTPS": str(api_port),
    }
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            data = config_maps.get(source["configMapRef"]["name"], {})
        elif "secretRef" in source:
            data = secrets.get(source["secretRef"]["name"], {})
        else:
            continue
        prefix = source.get("prefix", "")
        env.update({prefix + k: v for k, v in data.items()})
    for item in container.get("env", []):
        name = item["name"]
        if "value" in item:
            env[name] = _expand(str(item["value"]), env)
            continue
        source = item.get("valueFrom", {})
        if "fieldRef" in source:
            env[name] = _field_ref(pod, source["fieldRef"]["fieldPath"], node, host_ip, pod_ip)
        elif "resourceFieldRef" in source:
            env[name] = _resource_ref(container, source["resourceFieldRef"])
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            env[name] = config_maps.get(ref["name"], {}).get(ref["key"], "")
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            env[name] = secrets.get(ref["name"], {}).get(ref["key"], "")
        else:
            env[name] = ""
    return env


def _expand(value: str, env: Mapping[str, str]) -> str:
    """``$(VAR)`` expansion as Kubernetes does for env values and args."""
    out, i = [], 0
    while i < len(value):
        if value.startswith("$$", i):
            out.append("$")
            i += 2
        elif value.startswith("$(", i) and ")" in value[i:]:
            end = value.index(")", i)
            name = value[i + 2 : end]
            out.append(env.get(name, value[i : end + 1]))
            i = end + 1
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


def container_argv(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    command = list(container.get("command") or [])
    args = list(container.get("args") or [])
    argv = [_expand(str(a), env) for a in command + args]
    if not argv:
        raise UnsupportedSpecError(
            f"container {container.get('name')!r} has no command: images are not run here"
        )
    return argv


def working_dir(container: Mapping[str, Any]) -> str:
    """Processes run from the project checkout unless the pod says otherwise."""
    return str(container.get("workingDir") or REPO_ROOT)


@dataclasses.dataclass(frozen=True)
class Mount:
    source: Path
    target: str
    read_only: bool = False


def resolv_conf(ns: str) -> str:
    """The pod's /etc/resolv.conf: search domains as a cluster's, no nameserver.

    No DNS server runs here: every name a pod can resolve is in its
    /etc/hosts, and :func:`nsswitch_conf` makes that file the only source.
    (glibc reads a resolv.conf without a nameserver line as 127.0.0.1, so the
    missing line alone would not stop queries; the nsswitch line does.)
    """
    return (
        "# torchflex process kubelet: no DNS server; names come from /etc/hosts\n"
        f"search {ns}.svc.{CLUSTER_DOMAIN} svc.{CLUSTER_DOMAIN} {CLUSTER_DOMAIN}\n"
    )


def nsswitch_conf(host_text: str) -> str:
    """The host's nsswitch.conf with ``hosts: files`` only.

    Lookups of names and addresses end at the pod's /etc/hosts: an unknown
    name fails at once (not found) instead of timing out on a server that is
    not there (c10d's "hostname of the client socket cannot be retrieved.
    err=-3"), and nothing falls through to the machine's resolver.
    """
    lines = [ln for ln in host_text.splitlines() if not ln.strip().startswith("hosts:")]
    return "\n".join([*lines, "hosts:          files"]) + "\n"


def hosts_names(pod: Mapping[str, Any]) -> list[str]:
    """Names a pod answers to: its hostname and, with a subdomain, the FQDN forms."""
    meta, spec = pod["metadata"], pod.get("spec", {})
    host = pod_hostname(pod)
    sub = spec.get("subdomain")
    ns = meta.get("namespace", "default")
    if not sub:
        return [host]
    base = f"{host}.{sub}"
    return [f"{base}.{ns}.svc.{CLUSTER_DOMAIN}", f"{base}.{ns}.svc", f"{base}.{ns}", base, host]


def service_names(name: str, ns: str, same_namespace: bool) -> list[str]:
    names = [f"{name}.{ns}.svc.{CLUSTER_DOMAIN}", f"{name}.{ns}.svc", f"{name}.{ns}"]
    return [*names, name] if same_namespace else names


def selector_matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def hosts_file(
    pod: Mapping[str, Any],
    pod_ip: str,
    pods: Sequence[Mapping[str, Any]],
    services: Sequence[Mapping[str, Any]],
) -> str:
    """The /etc/hosts a pod sees: itself, pods with subdomains, Services → pod IPs.

    No name ever maps to a ClusterIP: nothing routes those here. A Service
    resolves to the IPs of the running pods its selector matches.
    """
    ns = pod["metadata"].get("namespace", "default")
    lines = ["127.0.0.1\tlocalhost", f"{pod_ip}\t{' '.join(hosts_names(pod))}"]
    running = [
        p
        for p in pods
        if p.get("status", {}).get("podIP")
        and p.get("status", {}).get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
    ]
    for other in running:
        if other["metadata"].get("uid") == pod["metadata"].get("uid"):
            continue
        if other.get("spec", {}).get("subdomain"):
            names = hosts_names(other)
            other_ns = other["metadata"].get("namespace", "default")
            if other_ns != ns:
                names = [n for n in names if n.count(".") >= 2]
            lines.append(f"{other['status']['podIP']}\t{' '.join(names)}")
    for svc in services:
        selector = svc.get("spec", {}).get("selector") or {}
        svc_ns = svc["metadata"].get("namespace", "default")
        names = service_names(svc["metadata"]["name"], svc_ns, svc_ns == ns)
        for other in running:
            if other["metadata"].get("namespace", "default") != svc_ns:
                continue
            if selector_matches(selector, other["metadata"].get("labels", {})):
                lines.append(f"{other['status']['podIP']}\t{' '.join(names)}")
    return "\n".join(lines) + "\n"
