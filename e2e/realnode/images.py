"""OCI image tarballs built here from local files, for ``ctr images import``.

Where it sits: ``e2e.realnode.node`` builds the pause image (Kubernetes'
pause.c, compiled static by the toolchain) and a busybox image (Debian's
busybox-static) with :func:`write_oci_archive` and imports them; no
registry is ever asked. One uncompressed layer per image, every timestamp
zero and owner root, so the same inputs give the same digests.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

from e2e.realnode.plan import BUSYBOX_IMAGE, PAUSE_IMAGE

LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
# The applets the test pods call through the image's /bin/sh.
BUSYBOX_APPLETS = (
    "sh", "echo", "cat", "ls", "sleep", "hostname", "id", "uname", "env", "nslookup",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class ImageSpec:
    """What goes into one image: files (path in image -> host file), symlinks,
    the entrypoint/cmd and the user to run as."""

    name: str
    files: dict[str, Path]
    symlinks: dict[str, str]
    entrypoint: list[str]
    cmd: list[str]
    user: str = ""


def pause_spec(pause_binary: Path) -> ImageSpec:
    # Upstream's pause image runs as 65535 with /pause as the entrypoint.
    return ImageSpec(PAUSE_IMAGE, {"pause": pause_binary}, {}, ["/pause"], [], "65535:65535")


def busybox_spec(busybox_binary: Path) -> ImageSpec:
    links = {f"bin/{applet}": "busybox" for applet in BUSYBOX_APPLETS}
    return ImageSpec(BUSYBOX_IMAGE, {"bin/busybox": busybox_binary}, links, [], ["/bin/sh"])


def _layer(spec: ImageSpec) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = sorted({str(Path(p).parent) for p in [*spec.files, *spec.symlinks]} - {"."})
        for d in [*dirs, "tmp", "etc"]:
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755, 0
            tar.addfile(info)
        for path, host in sorted(spec.files.items()):
            data = host.read_bytes()
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(data), 0o755, 0
            tar.addfile(info, io.BytesIO(data))
        for path, target in sorted(spec.symlinks.items()):
            info = tarfile.TarInfo(path)
            info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, target, 0o777, 0
            tar.addfile(info)
    return buf.getvalue()


def _descriptor(media_type: str, blob: bytes, **extra: Any) -> dict[str, Any]:
    return {
        "mediaType": media_type,
        "digest": "sha256:" + hashlib.sha256(blob).hexdigest(),
        "size": len(blob),
        **extra,
    }


def _blob(tar: tarfile.TarFile, blob: bytes) -> None:
    info = tarfile.TarInfo("blobs/sha256/" + hashlib.sha256(blob).hexdigest())
    info.size, info.mode = len(blob), 0o644
    tar.addfile(info, io.BytesIO(blob))


def write_oci_archive(spec: ImageSpec, out: Path) -> str:
    """Write an OCI image layout tarball; returns the manifest digest."""
    layer = _layer(spec)
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Entrypoint": spec.entrypoint or None,
                "Cmd": spec.cmd or None,
                "User": spec.user,
                "Env": ["PATH=/bin"],
                "WorkingDir": "/",
            },
            "rootfs": {"type": "layers", "diff_ids": [_descriptor(LAYER_TYPE, layer)["digest"]]},
        },
        sort_keys=True,
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": _descriptor(CONFIG_TYPE, config),
            "layers": [_descriptor(LAYER_TYPE, layer)],
        },
        sort_keys=True,
    ).encode()
    tag = spec.name.rsplit(":", 1)[1]
    entry = _descriptor(
        MANIFEST_TYPE,
        manifest,
        # containerd names the imported image from this annotation.
        annotations={
            "io.containerd.image.name": spec.name,
            "org.opencontainers.image.ref.name": tag,
        },
        platform={"architecture": "amd64", "os": "linux"},
    )
    index = {"schemaVersion": 2, "manifests": [entry]}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    with tarfile.open(tmp, mode="w") as tar:
        for blob in (layer, config, manifest):
            _blob(tar, blob)
        for name, doc in (("oci-layout", {"imageLayoutVersion": "1.0.0"}), ("index.json", index)):
            data = json.dumps(doc).encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    tmp.rename(out)
    return str(entry["digest"])
