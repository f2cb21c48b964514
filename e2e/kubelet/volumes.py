"""Materialising a pod's volumes as directories to bind-mount.

Where it sits: the process kubelet's ``agent`` calls :func:`prepare` before
starting a pod's containers. emptyDir → a per-pod directory; hostPath → the
path itself; persistentVolumeClaim → its bound volume's directory (only
volumes of the kubelet's own provisioner, which are hostPath ones);
configMap / secret / projected (ServiceAccount token from the TokenRequest
API, the cluster CA, downward API) → files written per pod, so in-cluster
config works and the pod's RBAC is enforced for real. downwardAPI volumes and
the downward API part of projected ones follow the pod's labels and
annotations (``downward``; :func:`refresh` on each pod update).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from e2e.kubelet import downward
from e2e.kubelet.podspec import Mount, UnsupportedSpecError


class Fetcher:
    """The few reads and the token request volumes need (``fetch.ApiFetcher``)."""

    def config_map(self, ns: str, name: str) -> dict[str, str]:
        raise NotImplementedError

    def secret(self, ns: str, name: str) -> dict[str, str]:
        raise NotImplementedError

    def token(
        self, ns: str, sa: str, pod: Mapping[str, Any], audience: str | None, seconds: int
    ) -> str:
        raise NotImplementedError

    def claim_path(self, ns: str, claim: str) -> Path:
        """The directory behind a bound PersistentVolumeClaim (see provisioner)."""
        raise NotImplementedError


def _write_items(
    target: Path, data: Mapping[str, str], items: list[Mapping[str, Any]] | None
) -> None:
    target.mkdir(parents=True, exist_ok=True)
    chosen = {i["key"]: i.get("path", i["key"]) for i in items} if items else {k: k for k in data}
    for key, rel in chosen.items():
        if key in data:
            path = target / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(data[key])


def _projected(
    pod: Mapping[str, Any], vol: Mapping[str, Any], target: Path, fetch: Fetcher
) -> None:
    ns = pod["metadata"].get("namespace", "default")
    target.mkdir(parents=True, exist_ok=True)
    for source in vol.get("sources", []):
        if "serviceAccountToken" in source:
            tok = source["serviceAccountToken"]
            sa = pod.get("spec", {}).get("serviceAccountName") or "default"
            seconds = int(tok.get("expirationSeconds", 3607))
            value = fetch.token(ns, sa, pod, tok.get("audience"), seconds)
            (target / tok["path"]).write_text(value)
        elif "configMap" in source:
            cm = source["configMap"]
            _write_items(target, fetch.config_map(ns, cm["name"]), cm.get("items"))
        elif "secret" in source:
            sec = source["secret"]
            _write_items(target, fetch.secret(ns, sec["name"]), sec.get("items"))
    downward.sync_dir(target, downward.volume_files(pod, {"projected": vol}))


def prepare(
    pod: Mapping[str, Any], container: Mapping[str, Any], pod_dir: Path, fetch: Fetcher
) -> list[Mount]:
    """Mounts for one container; volumes are materialised once per pod directory."""
    ns = pod["metadata"].get("namespace", "default")
    volumes = {v["name"]: v for v in pod.get("spec", {}).get("volumes", [])}
    mounts: list[Mount] = []
    for vm in container.get("volumeMounts", []):
        vol = volumes.get(vm["name"])
        if vol is None:
            raise UnsupportedSpecError(f"volumeMount {vm['name']!r} has no volume")
        source = pod_dir / "volumes" / vm["name"]
        if "emptyDir" in vol:
            source.mkdir(parents=True, exist_ok=True)
        elif "hostPath" in vol:
            source = Path(vol["hostPath"]["path"])
            if vol["hostPath"].get("type") in ("DirectoryOrCreate", None, ""):
                source.mkdir(parents=True, exist_ok=True)
        elif "persistentVolumeClaim" in vol:
            source = fetch.claim_path(ns, vol["persistentVolumeClaim"]["claimName"])
        elif "downwardAPI" in vol:
            # Written at every start (only what changed): a restarted kubelet's
            # pod directory may hold the files of older metadata.
            downward.sync_dir(source, downward.volume_files(pod, vol))
        elif not source.exists():
            if "configMap" in vol:
                cm = vol["configMap"]
                _write_items(source, fetch.config_map(ns, cm["name"]), cm.get("items"))
            elif "secret" in vol:
                sec = vol["secret"]
                _write_items(source, fetch.secret(ns, sec["secretName"]), sec.get("items"))
            elif "projected" in vol:
                _projected(pod, vol["projected"], source, fetch)
            else:
                kinds = sorted(set(vol) - {"name"})
                raise UnsupportedSpecError(
                    f"volume {vm['name']!r} of type {kinds} is not supported"
                )
        if vm.get("subPath"):
            source = source / vm["subPath"]
            source.mkdir(parents=True, exist_ok=True)
        read_only = bool(vm.get("readOnly")) or bool(
            vol.get("persistentVolumeClaim", {}).get("readOnly")
        )
        mounts.append(Mount(source, vm["mountPath"], read_only))
    return mounts


def refresh(pod: Mapping[str, Any], pod_dir: Path) -> list[str]:
    """Rewrite the downward API files of ``pod``'s materialised volumes whose
    content its metadata changed (a running pod's update); returns
    ``volume/path`` of each file rewritten."""
    changed: list[str] = []
    for vol in pod.get("spec", {}).get("volumes", []):
        target = pod_dir / "volumes" / vol["name"]
        if not target.is_dir():
            continue
        try:
            wanted = downward.volume_files(pod, vol)
        except UnsupportedSpecError:
            # The container failed on it at start (CreateContainerConfigError).
            continue
        changed += [f"{vol['name']}/{p}" for p in downward.sync_dir(target, wanted)]
    return changed


def decode_secret(data: Mapping[str, str]) -> dict[str, str]:
    return {k: base64.b64decode(v).decode(errors="replace") for k, v in data.items()}
