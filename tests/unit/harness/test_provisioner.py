"""The process kubelet's volume provisioner: which claims get a volume, which volumes go."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from e2e.kubelet.provisioner import PROVISIONED_BY, PROVISIONER, STORAGE_CLASS, plan


def claim(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}"},
        "spec": {
            "storageClassName": STORAGE_CLASS,
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": "2Gi"}},
            **spec,
        },
        "status": {"phase": "Pending"},
    }


def volume(name: str, phase: str, ours: bool = True) -> dict[str, Any]:
    annotations = {PROVISIONED_BY: PROVISIONER} if ours else {}
    return {"metadata": {"name": name, "annotations": annotations}, "status": {"phase": phase}}


def test_a_pending_claim_of_our_class_gets_a_volume_bound_to_it() -> None:
    create, delete = plan([claim("ckpt")], [], Path("/state/volumes"))
    assert delete == []
    (pv,) = create
    assert pv["metadata"]["name"] == "pvc-u-ckpt"
    assert pv["spec"]["claimRef"] == {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "namespace": "ns",
        "name": "ckpt",
        "uid": "u-ckpt",
    }
    assert pv["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pv["spec"]["capacity"] == {"storage": "2Gi"}
    assert pv["spec"]["hostPath"]["path"] == "/state/volumes/pvc-u-ckpt"


def test_claims_not_for_us_or_already_served_are_left_alone() -> None:
    claims = [
        claim("other", storageClassName="fast"),
        claim("named", volumeName="pv-x"),
        claim("again"),
        {**claim("bound"), "status": {"phase": "Bound"}},
    ]
    create, _ = plan(claims, [volume("pvc-u-again", "Available")], Path("/v"))
    assert create == []


def test_only_our_released_volumes_are_deleted() -> None:
    volumes = [
        volume("pvc-a", "Released"),
        volume("pvc-b", "Bound"),
        volume("pvc-c", "Released", ours=False),
    ]
    assert plan([], volumes, Path("/v"))[1] == ["pvc-a"]
