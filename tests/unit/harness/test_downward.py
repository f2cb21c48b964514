"""The process kubelet's downward API files: what a pod's volumes hold, which
files an update rewrites (pure), and that the rewrite is a rename in place.

The pod is shaped as the operator shapes a warm spare (issue 18): one
``downwardAPI`` volume whose item is the standby annotation.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from e2e.kubelet import downward, volumes
from e2e.kubelet.podspec import UnsupportedSpecError
from torchflex_contract import env
from torchflex_contract.labels import Annotation

STANDBY_REF = f"metadata.annotations['{Annotation.STANDBY}']"


def _item(path: str, field: str) -> dict[str, Any]:
    return {"path": path, "fieldRef": {"fieldPath": field}}


def _spare(standby: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "job-worker-3",
            "namespace": "ns",
            "uid": "u1",
            "labels": {"app": "job", "index": "3"},
            "annotations": {Annotation.STANDBY: standby},
        },
        "spec": {
            "volumes": [
                {
                    "name": env.STANDBY_VOLUME,
                    "downwardAPI": {"items": [_item(env.STANDBY_FILE_NAME, STANDBY_REF)]},
                },
                {
                    "name": "info",
                    "projected": {
                        "sources": [
                            {"downwardAPI": {"items": [_item("labels", "metadata.labels")]}},
                            {"downwardAPI": {"items": [_item("sub/name", "metadata.name")]}},
                        ]
                    },
                },
                {"name": "scratch", "emptyDir": {}},
            ]
        },
    }


def _volume(pod: dict[str, Any], name: str) -> dict[str, Any]:
    return next(v for v in pod["spec"]["volumes"] if v["name"] == name)


def test_volume_files_of_downward_and_projected_volumes() -> None:
    pod = _spare("true")
    assert downward.volume_files(pod, _volume(pod, env.STANDBY_VOLUME)) == {
        env.STANDBY_FILE_NAME: env.STANDBY_TRUE
    }
    assert downward.volume_files(pod, _volume(pod, "info")) == {
        "labels": 'app="job"\nindex="3"',
        "sub/name": "job-worker-3",
    }
    assert downward.volume_files(pod, _volume(pod, "scratch")) == {}


def test_an_annotation_update_rewrites_only_the_file_it_changed() -> None:
    old = _spare("true")
    new = copy.deepcopy(old)
    new["metadata"]["annotations"][Annotation.STANDBY] = "false"
    for name, rewritten in ((env.STANDBY_VOLUME, {env.STANDBY_FILE_NAME: "false"}), ("info", {})):
        on_disk = downward.volume_files(old, _volume(old, name))
        assert downward.stale(on_disk, downward.volume_files(new, _volume(new, name))) == rewritten
    # The same pod again (a status update): nothing to write.
    on_disk = downward.volume_files(old, _volume(old, env.STANDBY_VOLUME))
    assert downward.stale(on_disk, on_disk) == {}


def test_a_missing_file_or_annotation() -> None:
    wanted = {"a": "1", "b": "2"}
    assert downward.stale({"a": "1", "b": None}, wanted) == {"b": "2"}
    # An annotation the pod lacks reads as empty, as a kubelet writes it.
    pod = _spare("true")
    del pod["metadata"]["annotations"]
    assert downward.volume_files(pod, _volume(pod, env.STANDBY_VOLUME)) == {
        env.STANDBY_FILE_NAME: ""
    }


@pytest.mark.parametrize(
    "item",
    [
        _item("ip", "status.podIP"),
        {"path": "cpu", "resourceFieldRef": {"resource": "limits.cpu"}},
    ],
)
def test_unsupported_items_are_refused(item: dict[str, Any]) -> None:
    pod = _spare("true")
    with pytest.raises(UnsupportedSpecError):
        downward.volume_files(pod, {"name": "x", "downwardAPI": {"items": [item]}})


def test_refresh_renames_changed_files_into_materialised_volumes(tmp_path: Path) -> None:
    old = _spare("true")
    vol_dir = tmp_path / "volumes"
    # Materialised at start: the standby volume and the projected one; not scratch.
    for name in (env.STANDBY_VOLUME, "info"):
        (vol_dir / name).mkdir(parents=True)
    assert volumes.refresh(old, tmp_path) == [
        f"{env.STANDBY_VOLUME}/{env.STANDBY_FILE_NAME}",
        "info/labels",
        "info/sub/name",
    ]
    standby = vol_dir / env.STANDBY_VOLUME / env.STANDBY_FILE_NAME
    assert standby.read_text() == env.STANDBY_TRUE
    before = standby.stat().st_ino
    assert volumes.refresh(old, tmp_path) == []

    new = copy.deepcopy(old)
    new["metadata"]["annotations"][Annotation.STANDBY] = "false"
    assert volumes.refresh(new, tmp_path) == [f"{env.STANDBY_VOLUME}/{env.STANDBY_FILE_NAME}"]
    assert standby.read_text() == "false"
    # A new file renamed over the old one (a reader never sees it half-written),
    # and no temporary file left behind.
    assert standby.stat().st_ino != before
    assert sorted(p.name for p in standby.parent.iterdir()) == [env.STANDBY_FILE_NAME]
    assert not (vol_dir / "scratch").exists()


def test_refresh_skips_a_volume_the_pod_failed_on(tmp_path: Path) -> None:
    pod = _spare("true")
    pod["spec"]["volumes"].append(
        {"name": "bad", "downwardAPI": {"items": [_item("ip", "status.podIP")]}}
    )
    (tmp_path / "volumes" / "bad").mkdir(parents=True)
    (tmp_path / "volumes" / env.STANDBY_VOLUME).mkdir(parents=True)
    assert volumes.refresh(pod, tmp_path) == [f"{env.STANDBY_VOLUME}/{env.STANDBY_FILE_NAME}"]
