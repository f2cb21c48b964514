"""A default StorageClass and a directory provisioner for the process kubelet.

Where it sits: ``agent.Kubelet.run`` registers :data:`STORAGE_CLASS` (the
cluster's default, so a PVC without ``storageClassName`` gets it from the
DefaultStorageClass admission plugin) and runs :meth:`Provisioner.loop` in a
thread. A Pending claim of that class gets a PersistentVolume backed by a
directory in the cluster's state directory, pre-bound to the claim, and the
real PV controller binds it; a Released one is deleted with its directory.
Every node of the process kubelet is the same machine, so such a volume is
ReadWriteMany for real (what a checkpoint volume shared by every worker
needs). ``plan`` is pure; the loop only applies it.

``volumes.prepare`` mounts a claim at :func:`claim_path` (claim -> volume ->
hostPath).
"""

from __future__ import annotations

import contextlib
import shutil
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kubernetes import client

from e2e.kubelet.podspec import UnsupportedSpecError

STORAGE_CLASS = "torchflex-local"
PROVISIONER = "torchflex.io/process-kubelet"
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
POLL_S = 1.0
REQUEST_TIMEOUT_S = 5.0


def storage_class() -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": STORAGE_CLASS,
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
        },
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }


def volume_name(claim: Mapping[str, Any]) -> str:
    return f"pvc-{claim['metadata']['uid']}"


def plan(
    claims: Sequence[Mapping[str, Any]], volumes: Sequence[Mapping[str, Any]], root: Path
) -> tuple[list[dict[str, Any]], list[str]]:
    """(volumes to create, names of our volumes to delete)."""
    existing = {v["metadata"]["name"] for v in volumes}
    create = []
    for claim in claims:
        spec, meta = claim.get("spec", {}), claim["metadata"]
        if spec.get("storageClassName") != STORAGE_CLASS or spec.get("volumeName"):
            continue
        if claim.get("status", {}).get("phase", "Pending") != "Pending":
            continue
        if meta.get("deletionTimestamp") or volume_name(claim) in existing:
            continue
        size = spec.get("resources", {}).get("requests", {}).get("storage", "1Gi")
        create.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {
                    "name": volume_name(claim),
                    "annotations": {PROVISIONED_BY: PROVISIONER},
                },
                "spec": {
                    "capacity": {"storage": size},
                    "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Delete",
                    "storageClassName": STORAGE_CLASS,
                    "volumeMode": "Filesystem",
                    "hostPath": {
                        "path": str(root / volume_name(claim)),
                        "type": "DirectoryOrCreate",
                    },
                    "claimRef": {
                        "apiVersion": "v1",
                        "kind": "PersistentVolumeClaim",
                        "namespace": meta["namespace"],
                        "name": meta["name"],
                        "uid": meta["uid"],
                    },
                },
            }
        )
    delete = [
        v["metadata"]["name"]
        for v in volumes
        if v["metadata"].get("annotations", {}).get(PROVISIONED_BY) == PROVISIONER
        and v.get("status", {}).get("phase") == "Released"
        and v["metadata"]["name"].startswith("pvc-")
    ]
    return create, delete


class Provisioner:
    def __init__(self, api: client.ApiClient, root: Path, stop: threading.Event) -> None:
        self.core = client.CoreV1Api(api)
        self.storage = client.StorageV1Api(api)
        self.root, self.stop = root, stop

    def register(self) -> None:
        with contextlib.suppress(client.ApiException):  # 409: already there
            self.storage.create_storage_class(
                storage_class(),  # type: ignore[arg-type]
                _request_timeout=REQUEST_TIMEOUT_S,
            )

    def once(self) -> None:
        claims = self.core.api_client.sanitize_for_serialization(
            self.core.list_persistent_volume_claim_for_all_namespaces(
                _request_timeout=REQUEST_TIMEOUT_S
            ).items
        )
        volumes = self.core.api_client.sanitize_for_serialization(
            self.core.list_persistent_volume(_request_timeout=REQUEST_TIMEOUT_S).items
        )
        create, delete = plan(claims, volumes, self.root)
        for pv in create:
            Path(pv["spec"]["hostPath"]["path"]).mkdir(parents=True, exist_ok=True)
            self.core.create_persistent_volume(pv, _request_timeout=REQUEST_TIMEOUT_S)  # type: ignore[arg-type]
        for name in delete:
            with contextlib.suppress(client.ApiException):  # 404: gone already
                self.core.delete_persistent_volume(name, _request_timeout=REQUEST_TIMEOUT_S)
            shutil.rmtree(self.root / name, ignore_errors=True)

    def loop(self) -> None:
        """Until the kubelet stops; a failed round (API away) is the next round's job."""
        while not self.stop.wait(POLL_S):
            with contextlib.suppress(Exception):
                self.once()


def claim_path(core: client.CoreV1Api, ns: str, claim: str) -> Path:
    """The directory behind a bound claim: claim -> volume -> hostPath."""
    pvc = core.read_namespaced_persistent_volume_claim(
        claim, ns, _request_timeout=REQUEST_TIMEOUT_S
    )
    name = pvc.spec.volume_name if pvc.spec is not None else None
    if not name:
        raise UnsupportedSpecError(f"claim {ns}/{claim} is not bound")
    pv = core.read_persistent_volume(name, _request_timeout=REQUEST_TIMEOUT_S)
    host = pv.spec.host_path if pv.spec is not None else None
    if host is None:
        raise UnsupportedSpecError(f"volume {name} is not a directory on this machine")
    path = Path(host.path)
    path.mkdir(parents=True, exist_ok=True)
    return path
