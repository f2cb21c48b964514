"""Build the project's images with buildah and push them to the local registry (issue 16).

Where it sits: used by ``tests/realnode`` (and anything that wants the
operator image on a real node). Storage is the slot's own
(``<cluster state dir>/images/buildah``, never ``/var/lib/containers``):

1. The base image from the root filesystem ``build.sh --real-nodes`` made
   with mmdebstrap (Debian's python3.11): ``buildah from scratch`` + ``add``
   + ``commit`` as ``torchflex.local/python:3.11-<deb version>``, once per
   storage.
2. ``docker/operator.Dockerfile`` and ``docker/agent.Dockerfile`` (torch from
   PyPI, ``build_agent_image``), with ``--build-arg PYTHON_IMAGE=<that base>``
   (upstream builds keep ``python:3.11-slim``) and their own ``.dockerignore``;
   ``--layers`` keeps the pip layers cached.
   ``RUN`` steps use the host's network, pip config and CA bundle (pip
   reaches the package index the way ``make venv`` does); nothing of that
   is a test's traffic.
3. ``buildah push`` over plain HTTP to ``127.0.0.1:<port>``, tagged
   ``ctx-<key>`` by the content key of the build's inputs
   (``e2e.realnode.buildcontext``: Dockerfile, .dockerignore, build
   arguments, the base's image ID, the context's files), so a pod's
   ``IfNotPresent`` pull is never stale. When the registry already serves
   that tag, build and push are skipped: nothing the build reads changed.

buildah's temporary files (a build's context copy, a push's blobs: GBs for
the agent image) go to ``buildah/tmp/<pid>-<start time>/`` in the images
folder, not ``/var/tmp``; a build killed midway leaves its folder there, and
the next build removes the folders of processes that no longer run, and,
when no other process builds in the same storage, the working containers
a killed build left there (``buildah rm --all``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from e2e.realnode import buildcontext, registry
from e2e.realnode.node import unmount_under
from e2e.realnode.registry import ImagesPaths
from e2e.toolchain.versions import VERSIONS

REPO = Path(__file__).resolve().parents[2]
OPERATOR_REPOSITORY = "torchflex-operator"
AGENT_REPOSITORY = "torchflex-agent"
# torch from PyPI, the CUDA build: the agent Dockerfile's default (CPU wheels) is unreachable here.
PYPI_SIMPLE = "https://pypi.org/simple"
# The base's pins name it (root filesystem tarball and image tag): a new pin, a new base.
_BASE_KEY = "_".join(
    re.sub(r"[^A-Za-z0-9_.-]", "-", VERSIONS[key])
    for key in ("LIBSTDCXX_DEB_VERSION", "PYTHON_DEB_VERSION")
)
BASE_IMAGE = f"torchflex.local/python:3.11-libstdcxx-{_BASE_KEY}"


class ImageBuildError(RuntimeError):
    """A buildah step failed; the message has its output tail."""


@dataclasses.dataclass(frozen=True)
class PushedImage:
    """An image in the local registry, and what it cost."""

    address: str  # the registry's host:port
    repository: str  # in the registry, e.g. torchflex-operator
    tag: str
    local_size: str  # uncompressed, as ``buildah images`` rounds it ("342 MB")
    pushed_bytes: int  # config + compressed layers, what a pull transfers
    base_s: float  # importing the base into the storage (0 when it was there)
    build_s: float
    push_s: float
    cached: bool = False  # the registry had this content key's tag: no build, no push

    @property
    def reference(self) -> str:
        return f"{self.address}/{self.repository}:{self.tag}"


def base_rootfs(bin_dir: Path) -> Path:
    """Where ``build.sh --real-nodes`` wrote the mmdebstrap root filesystem."""
    return bin_dir / f"base-python3.11_{_BASE_KEY}.tar"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22):
    with the PID, it names one process even after the PID is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _tmp_dir(images: ImagesPaths) -> Path:
    """This process's buildah TMPDIR; made on first use."""
    path = images.buildah_tmp / f"{os.getpid()}-{_start_time(os.getpid())}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _tmp_folders(images: ImagesPaths) -> list[tuple[Path, int, bool]]:
    """The TMPDIR folders named as :func:`_tmp_dir` names them: (folder, PID, process alive)."""
    found = []
    for entry in images.buildah_tmp.iterdir() if images.buildah_tmp.is_dir() else ():
        pid, _, started = entry.name.partition("-")
        if entry.is_dir() and pid.isdigit() and started:
            found.append((entry, int(pid), _start_time(int(pid)) == started))
    return found


def clear_dead_tmp(images: ImagesPaths) -> list[Path]:
    """Remove the TMPDIR folders of building processes that are gone (a killed build
    leaves GBs there); only folders named as :func:`_tmp_dir` names them. Returns them."""
    removed = []
    for entry, _, alive in _tmp_folders(images):
        if not alive:
            unmount_under(entry)
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def clear_dead_containers(images: ImagesPaths) -> bool:
    """Remove the working containers a killed build left in the storage (a stage's
    container holds what its RUN wrote so far: GBs midway through the torch layer),
    but only when no other process builds in this storage; returns whether it did."""
    if any(alive and pid != os.getpid() for _, pid, alive in _tmp_folders(images)):
        return False
    _buildah(images, "rm", "--all")
    return True


def _buildah(
    images: ImagesPaths, *args: str, timeout_s: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    argv = [
        "buildah", "--root", str(images.buildah_root), "--runroot", str(images.buildah_runroot),
        "--storage-driver", "overlay", *args,
    ]  # fmt: skip
    env = {**os.environ, "TMPDIR": str(_tmp_dir(images))}
    out = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout_s, check=False, env=env
    )
    if check and out.returncode != 0:
        tail = "\n".join((out.stdout + out.stderr).splitlines()[-30:])
        raise ImageBuildError(f"buildah {' '.join(args)}: exit {out.returncode}\n{tail}")
    return out


def _image_id(images: ImagesPaths, name: str) -> str | None:
    out = _buildah(
        images, "inspect", "--type", "image", "--format", "{{.FromImageID}}", name, check=False
    )
    return out.stdout.strip() or None if out.returncode == 0 else None


def base_image(images: ImagesPaths, rootfs: Path) -> str:
    """The python3.11 base in the slot's storage (imported once)."""
    if _image_id(images, BASE_IMAGE):
        return BASE_IMAGE
    ctr = _buildah(images, "from", "--pull=never", "scratch").stdout.strip()
    try:
        _buildah(images, "add", ctr, str(rootfs), "/")  # a local tarball is extracted
        _buildah(
            images, "config", "--env", "LANG=C.UTF-8",
            "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "--cmd", "python3", ctr,
        )  # fmt: skip
        _buildah(images, "commit", ctr, BASE_IMAGE)
    finally:
        _buildah(images, "rm", ctr, check=False)
    return BASE_IMAGE


def _host_trust() -> list[str]:
    """Volumes (read-only, RUN steps only: never in a layer) that give pip in
    the build the host's pip config and CA bundle. This machine reaches the
    package index through a TLS-inspecting proxy whose CA only the host's
    bundle has; Debian's bundle in the base image fails with
    CERTIFICATE_VERIFY_FAILED."""
    return [
        f"--volume={path}:{path}:ro"
        for path in (Path("/etc/pip.conf"), Path("/etc/ssl/certs/ca-certificates.crt"))
        if path.is_file()
    ]


def _local_size(images: ImagesPaths, image_id: str) -> str:
    listed = json.loads(_buildah(images, "images", "--json").stdout or "[]")
    for entry in listed:
        short = str(entry.get("id", ""))
        if short and image_id.startswith(short):
            return str(entry["size"])
    raise ImageBuildError(f"image {image_id} not in buildah's list")


def _build_and_push(
    images: ImagesPaths,
    rootfs: Path,
    address: str,
    *,
    name: str,
    build_args: tuple[tuple[str, str], ...] = (),
    timeout_s: float = 900,
) -> PushedImage:
    """``docker/<name>.Dockerfile`` built on the local base, pushed as
    ``<address>/torchflex-<name>:ctx-<content key>``; neither when the registry has that tag."""
    repository = {"operator": OPERATOR_REPOSITORY, "agent": AGENT_REPOSITORY}[name]
    clear_dead_tmp(images)
    t0 = time.monotonic()
    base = base_image(images, rootfs)
    base_s = time.monotonic() - t0
    dockerfile = REPO / "docker" / f"{name}.Dockerfile"
    ignorefile = REPO / "docker" / f"{name}.Dockerfile.dockerignore"
    args = {"PYTHON_IMAGE": base, **dict(build_args)}
    key = buildcontext.context_key(
        REPO, dockerfile, ignorefile, args, _image_id(images, base) or ""
    )
    tag = f"ctx-{key[:16]}"
    record = images.built / f"{repository}_{tag}.json"
    image = PushedImage(address, repository, tag, "?", 0, base_s, 0.0, 0.0, cached=True)
    if registry.has_manifest(address, repository, tag):
        size = json.loads(record.read_text())["local_size"] if record.is_file() else "?"
        return dataclasses.replace(
            image, local_size=size, pushed_bytes=registry.pushed_size(address, repository, tag)
        )
    clear_dead_containers(images)
    iid = images.root / f"{name}.iid"
    build_argv = [arg for k, v in args.items() for arg in ("--build-arg", f"{k}={v}")]
    t0 = time.monotonic()
    _buildah(
        images, "bud", "--layers", "--force-rm", "--pull=never",
        "--network", "host", *_host_trust(), *build_argv,
        "--ignorefile", str(ignorefile), "--iidfile", str(iid), "-f", str(dockerfile),
        "-t", f"torchflex.local/{repository}:build", str(REPO),
        timeout_s=timeout_s,
    )  # fmt: skip
    build_s = time.monotonic() - t0
    image_id = iid.read_text().strip().removeprefix("sha256:")
    t0 = time.monotonic()
    _buildah(
        images, "push", "--quiet", "--format", "oci", "--tls-verify=false", image_id,
        f"docker://{address}/{repository}:{tag}",
        timeout_s=timeout_s,
    )  # fmt: skip
    push_s = time.monotonic() - t0
    size = _local_size(images, image_id)
    images.built.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"local_size": size, "image_id": image_id}) + "\n")
    return dataclasses.replace(
        image,
        local_size=size,
        pushed_bytes=registry.pushed_size(address, repository, tag),
        build_s=build_s,
        push_s=push_s,
        cached=False,
    )


def operator_image(images: ImagesPaths, rootfs: Path, address: str) -> PushedImage:
    """Build ``docker/operator.Dockerfile`` on the local base and push it."""
    return _build_and_push(images, rootfs, address, name="operator")


def build_agent_image(
    images: ImagesPaths, rootfs: Path, address: str, *, torch_index_url: str = PYPI_SIMPLE
) -> PushedImage:
    """Build ``docker/agent.Dockerfile`` on the local base and push it.

    torch comes from ``torch_index_url`` (PyPI, the one index this machine
    reaches: its torch is the CUDA build, GBs of ``nvidia-*`` wheels). The
    Dockerfile installs it in a layer keyed by ``constraints.txt`` alone, and
    the final stage starts from that layer, so a code change rebuilds and
    pushes only the small layers (the registry has the big one: its blob is
    not sent again); no change at all builds nothing.
    """
    return _build_and_push(
        images,
        rootfs,
        address,
        name="agent",
        build_args=(("TORCH_INDEX_URL", torch_index_url),),
        timeout_s=3600,
    )
