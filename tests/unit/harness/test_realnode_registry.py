"""The real node's local registry, pure parts (issue 16): the registry listens
on loopback only and keeps its data in the slot's state dir (or where
``TORCHFLEX_IMAGES_DIR`` says, as CI does); containerd finds
it through a ``hosts.toml`` under the node's own directory, over plain HTTP
to that same address and nowhere else."""

from __future__ import annotations

import ipaddress
import tomllib
from pathlib import Path

import pytest
import yaml

from e2e.realnode import imagebuild, plan, registry
from e2e.realnode.registry import ImagesPaths
from e2e.toolchain.versions import VERSIONS


def test_registry_listens_on_loopback_with_data_in_the_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(registry.IMAGES_DIR_ENV, raising=False)
    images = ImagesPaths.of(tmp_path)
    conf = yaml.safe_load(plan.registry_config_yaml(images.registry_data, "127.0.0.1:5123"))
    host, port = conf["http"]["addr"].rsplit(":", 1)
    assert ipaddress.IPv4Address(host).is_loopback and port == "5123"
    assert Path(conf["storage"]["filesystem"]["rootdirectory"]).is_relative_to(tmp_path)
    assert "debug" not in conf["http"]  # no second listener
    assert images.buildah_root.is_relative_to(tmp_path)
    assert images.buildah_runroot.is_relative_to(tmp_path)


def test_images_dir_outside_the_checkout_when_ci_names_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(registry.IMAGES_DIR_ENV, str(tmp_path / "cache" / "images"))
    images = ImagesPaths.of(tmp_path / "checkout" / ".cluster")
    assert images.buildah_root.is_relative_to(tmp_path / "cache" / "images")
    assert images.registry_data.is_relative_to(tmp_path / "cache" / "images")


def test_containerd_pulls_from_it_over_plain_http_only(tmp_path: Path) -> None:
    p = plan.NodePaths.of(tmp_path)
    cri = tomllib.loads(plan.containerd_toml(p))["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["registry"] == {"config_path": str(p.registry_hosts)}
    assert p.registry_hosts in p.dirs()
    hosts = tomllib.loads(plan.registry_hosts_toml("127.0.0.1:5123"))
    assert hosts["server"] == "http://127.0.0.1:5123"
    assert hosts["host"] == {"http://127.0.0.1:5123": {"capabilities": ["pull", "resolve"]}}


def test_base_image_and_rootfs_are_named_by_the_pinned_python() -> None:
    version = VERSIONS["PYTHON_DEB_VERSION"]
    # Debian's '+' and '~' are not allowed in a tag; the name stays readable.
    assert imagebuild.BASE_IMAGE.startswith("torchflex.local/python:3.11-")
    assert "+" not in imagebuild.BASE_IMAGE.rsplit(":", 1)[1]
    assert imagebuild.BASE_IMAGE.endswith(version.replace("+", "-"))
    rootfs = imagebuild.base_rootfs(Path("/cache/bin"))
    assert rootfs.parent == Path("/cache/bin") and rootfs.name.startswith("base-python3.11_")
