"""The real-node flavor's local image registry on loopback (issue 16).

Where it sits: beside ``e2e.realnode.node``. The CNCF distribution registry
(built from its Go module by ``build.sh --real-nodes``) runs by PID with
its storage under ``<cluster state dir>/images/registry``, listening on
``127.0.0.1:<free port>``. containerd reaches it over plain HTTP through
the ``hosts.toml`` written here into its ``config_path`` (read at each pull,
so the registry may start after containerd). ``e2e.realnode.imagebuild``
pushes to it; the kubelet pulls from it like from any registry.
"""

from __future__ import annotations

import dataclasses
import json
import os
import urllib.request
from pathlib import Path
from typing import Any

from e2e.cluster import processes
from e2e.localproc import free_port
from e2e.polling import poll_until
from e2e.realnode import plan
from e2e.realnode.plan import NodePaths
from e2e.toolchain.versions import VERSIONS

NAME = "registry"
# Where the images' state lives instead of <cluster state dir>/images (.ci/run sets it,
# see ImagesPaths.of).
IMAGES_DIR_ENV = "TORCHFLEX_IMAGES_DIR"


class RegistryError(RuntimeError):
    """The registry did not come up or did not answer; the message has its log tail."""


@dataclasses.dataclass(frozen=True)
class ImagesPaths:
    """The slot's image state: buildah storage and the registry (kept across
    real-node restarts, so a warm rebuild reuses cached layers)."""

    root: Path

    @classmethod
    def of(cls, cluster_root: Path) -> ImagesPaths:
        # CI runs from a fresh clone each time: with TORCHFLEX_IMAGES_DIR outside it, the
        # next run reuses buildah's layers (the agent image's torch layer is GBs and
        # minutes of pip) and the registry's blobs instead of building them again.
        given = os.environ.get(IMAGES_DIR_ENV)
        return cls(Path(given) if given else cluster_root / "images")

    @property
    def registry_data(self) -> Path:
        return self.root / "registry"

    @property
    def registry_config(self) -> Path:
        return self.root / "registry.yaml"

    @property
    def address_file(self) -> Path:
        return self.root / "registry.address"

    @property
    def pids(self) -> Path:
        return self.root / "pids"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def buildah_root(self) -> Path:
        return self.root / "buildah" / "root"

    @property
    def buildah_runroot(self) -> Path:
        return self.root / "buildah" / "run"

    @property
    def buildah_tmp(self) -> Path:
        """buildah's TMPDIR (one folder per building process), never /var/tmp."""
        return self.root / "buildah" / "tmp"

    @property
    def built(self) -> Path:
        """A record per image pushed (its size in buildah's storage), by repository and tag."""
        return self.root / "built"


def _get(url: str, accept: str = "") -> tuple[int, bytes]:
    # Loopback only; no proxy from the environment may take the request elsewhere.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with opener.open(req, timeout=5) as resp:
            return int(resp.status), bytes(resp.read())
    except OSError:
        return 0, b""


def registry_up(bin_dir: Path, images: ImagesPaths, node: NodePaths) -> str:
    """Start (or reuse) the slot's registry; returns its ``127.0.0.1:<port>``."""
    for d in (images.registry_data, images.pids, images.logs):
        d.mkdir(parents=True, exist_ok=True)
    if processes.alive(images.pids, NAME) and images.address_file.exists():
        address = images.address_file.read_text().strip()
    else:
        address = f"127.0.0.1:{free_port()}"
        images.registry_config.write_text(plan.registry_config_yaml(images.registry_data, address))
        binary = bin_dir / f"registry-{VERSIONS['DISTRIBUTION_VERSION']}"
        # v3 traces through OpenTelemetry when an exporter is configured: none.
        env = {**os.environ, "OTEL_TRACES_EXPORTER": "none"}
        argv = [str(binary), "serve", str(images.registry_config)]
        processes.spawn(NAME, argv, images.pids, images.logs, env)
        images.address_file.write_text(address + "\n")
    if not poll_until(lambda: _get(f"http://{address}/v2/")[0] == 200, 30.0):
        raise RegistryError(
            f"registry at {address} did not answer\n"
            + processes.exit_status_hint(images.logs, NAME)
        )
    hosts = node.registry_hosts / address
    hosts.mkdir(parents=True, exist_ok=True)
    (hosts / "hosts.toml").write_text(plan.registry_hosts_toml(address))
    return address


def registry_down(images: ImagesPaths) -> None:
    processes.stop(images.pids, NAME)
    images.address_file.unlink(missing_ok=True)


def manifest(address: str, repository: str, reference: str) -> dict[str, Any]:
    """The image manifest the registry serves (what a pull reads first)."""
    accept = ", ".join(
        (
            "application/vnd.oci.image.manifest.v1+json",
            "application/vnd.docker.distribution.manifest.v2+json",
        )
    )
    status, body = _get(f"http://{address}/v2/{repository}/manifests/{reference}", accept)
    if status != 200:
        raise RegistryError(f"{address}/{repository}:{reference}: HTTP {status}")
    data: dict[str, Any] = json.loads(body)
    return data


def has_manifest(address: str, repository: str, reference: str) -> bool:
    """Whether the registry serves ``repository:reference``."""
    try:
        manifest(address, repository, reference)
    except RegistryError:
        return False
    return True


def pushed_size(address: str, repository: str, reference: str) -> int:
    """Bytes a pull transfers: the config plus the compressed layers."""
    m = manifest(address, repository, reference)
    return int(m["config"]["size"]) + sum(int(layer["size"]) for layer in m["layers"])
