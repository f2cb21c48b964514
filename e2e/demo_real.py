"""``make demo NODES=real``: the demo's cluster side on a real node (issue 16).

Where it sits: used by ``e2e.demo`` in place of the process kubelet's
parts; the story (``e2e.demo.Demo``) is the same. Here: the slot's real
node (``e2e.realnode``: kubelet, containerd, runc, CNI, CoreDNS), the local
registry, the project's images built from ``docker/`` and pushed there
(``e2e.realnode.imagebuild``), the operator installed by ``helm install``
of the chart with that image (namespaced to the demo's namespace, plus
``e2e.realnode.chartvalues``), the job's pods running the agent image on
the real node, and the "machine dying" as ``ctr tasks kill -s SIGKILL`` of
a worker pod's containers: their PID 1 is the agent, and its PID namespace
takes the workers with it.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from e2e.cluster import Cluster
from e2e.realnode import RealNode, real_node_up
from e2e.realnode.chartvalues import cluster_values
from e2e.realnode.imagebuild import PushedImage, base_rootfs, build_agent_image, operator_image
from e2e.realnode.node import realnode_bin_dir
from e2e.realnode.plan import CRI_NAMESPACE
from e2e.realnode.registry import ImagesPaths, registry_up

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "helm" / "torchflex"
RELEASE = "torchflex-demo"
# The images' user (docker/agent.Dockerfile's USER): the job's hostPath checkpoint dir is its.
IMAGE_UID = 65532


class RealDemoError(RuntimeError):
    """A real-node step failed; the message says which and its output tail."""


@dataclasses.dataclass(frozen=True)
class RealParts:
    node: RealNode
    operator: PushedImage
    agent: PushedImage


def describe(image: PushedImage) -> str:
    head = f"{image.reference}: {image.local_size}, {image.pushed_bytes / 1e6:.0f} MB pushed"
    if image.cached:
        return f"{head}, in the registry already (no input changed): no build, no push"
    return f"{head}, build {image.build_s:.0f} s, push {image.push_s:.0f} s"


def prepare(cluster: Cluster) -> RealParts:
    """The real node, the registry and both images (cached layers make a rerun quick)."""
    node = real_node_up(cluster)
    bin_dir = realnode_bin_dir()
    images = ImagesPaths.of(cluster.layout.root)
    address = registry_up(bin_dir, images, node.paths)
    rootfs = base_rootfs(bin_dir)
    return RealParts(
        node=node,
        operator=operator_image(images, rootfs, address),
        agent=build_agent_image(images, rootfs, address),
    )


def checkpoint_dir(path: Path) -> None:
    """A hostPath the job's pods (the image's non-root user) can write."""
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, IMAGE_UID, IMAGE_UID)


class OperatorRelease:
    """The chart installed with the operator image, watching one namespace."""

    def __init__(self, cluster: Cluster, namespace: str, image: PushedImage) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.image = image
        self._home = tempfile.TemporaryDirectory(prefix="tf-demo-helm-")

    def _helm(self, *args: str, timeout_s: float = 240) -> None:
        env = {**self.cluster.env, "HOME": self._home.name}
        env.update(HELM_CACHE_HOME=self._home.name, HELM_CONFIG_HOME=self._home.name)
        env["HELM_DATA_HOME"] = self._home.name
        helm = str(self.cluster.layout.bin / "helm")
        out = subprocess.run(
            [helm, *args, "-n", self.namespace],
            env=env, capture_output=True, text=True, timeout=timeout_s, check=False,
        )  # fmt: skip
        if out.returncode != 0:
            raise RealDemoError(f"helm {args[0]}: {out.stderr.strip()[-2000:]}")

    def values(self) -> dict[str, Any]:
        here = cluster_values(self.cluster)
        return {
            **here,
            "image": {
                "repository": f"{self.image.address}/{self.image.repository}",
                "tag": self.image.tag,
            },
            "watch": {"mode": "namespaced", "namespaces": [self.namespace]},
        }

    def install(self) -> None:
        # Cluster-scoped objects of an earlier run's release whose namespace went first.
        self.cluster.kubectl(
            "delete", "clusterroles,clusterrolebindings", "-l",
            f"app.kubernetes.io/instance={RELEASE}", "--ignore-not-found", check=False,
        )  # fmt: skip
        vfile = Path(self._home.name) / "values.yaml"
        vfile.write_text(yaml.safe_dump(self.values()))
        self._helm("install", RELEASE, str(CHART), "--wait", "--timeout", "180s", "-f", str(vfile))

    def uninstall(self) -> None:
        try:
            self._helm("uninstall", RELEASE, "--wait", "--timeout", "60s", timeout_s=90)
        finally:
            self._home.cleanup()


def kill_pod_containers(cluster: Cluster, node: RealNode, namespace: str, pod: str) -> list[str]:
    """SIGKILL each running container of ``pod`` through the node's containerd."""
    status = cluster.get_json("pod", pod, "-n", namespace).get("status") or {}
    killed = []
    for container in status.get("containerStatuses") or []:
        cid = str(container.get("containerID", "")).removeprefix("containerd://")
        if not cid or "running" not in (container.get("state") or {}):
            continue
        argv = ["ctr", "--address", str(node.paths.socket), "--namespace", CRI_NAMESPACE]
        argv += ["tasks", "kill", "--signal", "SIGKILL", cid]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        if out.returncode == 0:
            killed.append(cid[:12])
    return killed
