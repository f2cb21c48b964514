"""The real node's plan and images (e2e.realnode.plan/images): pure checks
that run in `make test` without containerd or a kubelet.

Every address a real node uses is in the slot's own bridge range or on
loopback (the network rule); the configs name only the node's own paths;
the OCI archives hold what their manifests and index say, byte for byte.
"""

from __future__ import annotations

import hashlib
import io
import ipaddress
import json
import tarfile
import tomllib
from pathlib import Path

import yaml

from e2e.cluster.layout import BRIDGE, GATEWAY_IP, POD_PREFIX_LEN, POD_SUBNET_PREFIX
from e2e.realnode import images, plan

BRIDGE_NET = ipaddress.IPv4Network(f"{POD_SUBNET_PREFIX}.0.0/{POD_PREFIX_LEN}")


def test_addresses_stay_on_the_slots_bridge(tmp_path: Path) -> None:
    p = plan.NodePaths.of(tmp_path)
    conf = json.loads(plan.cni_conflist(p))
    (bridge,) = conf["plugins"]
    assert bridge["bridge"] == BRIDGE
    assert bridge["ipMasq"] is False
    assert bridge["ipam"]["routes"] == []  # no default route out of the pod
    ((rng,),) = bridge["ipam"]["ranges"]
    assert ipaddress.IPv4Network(rng["subnet"]) == BRIDGE_NET
    for key in ("rangeStart", "rangeEnd", "gateway"):
        assert ipaddress.IPv4Address(rng[key]) in BRIDGE_NET, key
    assert plan.NODE_IP == GATEWAY_IP

    kubelet = yaml.safe_load(
        plan.kubelet_config_yaml(
            p, tmp_path / "ca", tmp_path / "crt", tmp_path / "key", healthz_port=1, port=2
        )
    )
    assert ipaddress.IPv4Address(kubelet["address"]) in BRIDGE_NET
    assert ipaddress.IPv4Address(kubelet["healthzBindAddress"]).is_loopback
    assert kubelet["failCgroupV1"] is False
    assert kubelet["resolvConf"] == ""  # never the host's resolvers


def test_containerd_keeps_to_the_nodes_directory(tmp_path: Path) -> None:
    p = plan.NodePaths.of(tmp_path)
    conf = tomllib.loads(plan.containerd_toml(p))
    assert conf["grpc"]["address"] == str(p.socket)
    for path in (conf["root"], conf["state"], conf["ttrpc"]["address"]):
        assert Path(path).is_relative_to(p.root), path
    cri = conf["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == plan.PAUSE_IMAGE
    assert cri["restrict_oom_score_adj"] is True
    assert cri["cni"]["conf_dir"] == str(p.cni_conf_dir)
    assert ipaddress.IPv4Address(cri["stream_server_address"]).is_loopback


def _read(tar: tarfile.TarFile, member: tarfile.TarInfo | str) -> bytes:
    fh = tar.extractfile(member)
    assert fh is not None, member
    return fh.read()


def test_oci_archive_is_consistent_and_reproducible(tmp_path: Path) -> None:
    binary = tmp_path / "busybox"
    binary.write_bytes(b"\x7fELF not really")
    spec = images.busybox_spec(binary)
    first = images.write_oci_archive(spec, tmp_path / "a.tar")
    assert images.write_oci_archive(spec, tmp_path / "b.tar") == first
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()

    with tarfile.open(tmp_path / "a.tar") as tar:
        blobs = {
            m.name.removeprefix("blobs/sha256/"): _read(tar, m)
            for m in tar.getmembers()
            if m.name.startswith("blobs/")
        }
        index = json.loads(_read(tar, "index.json"))
    for digest, blob in blobs.items():
        assert hashlib.sha256(blob).hexdigest() == digest
    (entry,) = index["manifests"]
    assert entry["digest"] == first
    assert entry["annotations"]["io.containerd.image.name"] == plan.BUSYBOX_IMAGE
    manifest = json.loads(blobs[first.removeprefix("sha256:")])
    config = json.loads(blobs[manifest["config"]["digest"].removeprefix("sha256:")])
    (layer,) = manifest["layers"]
    assert config["rootfs"]["diff_ids"] == [layer["digest"]]
    with tarfile.open(fileobj=io.BytesIO(blobs[layer["digest"][7:]])) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members["bin/busybox"].size == len(binary.read_bytes())
    assert members["bin/sh"].issym() and members["bin/sh"].linkname == "busybox"
    assert all(m.mtime == 0 and m.uid == 0 for m in members.values())
