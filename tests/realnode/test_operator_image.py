"""``helm install`` with the operator image built here, pulled for real (issue 16).

The image is ``docker/operator.Dockerfile`` built by buildah on the Debian
base (mmdebstrap + python3.11) and pushed to the local registry on loopback;
the chart names it by ``image.repository``/``image.tag`` only, so the real
node's containerd pulls it over HTTP like any registry image. The operator
runs in its container as the chart says: uid 65532, read-only root
filesystem, all capabilities dropped; it reaches the API server through the
harness bridge (``KUBERNETES_SERVICE_HOST``: there is no kube-proxy for the
``kubernetes`` Service ClusterIP; docs/real-nodes.md).
"""

from __future__ import annotations

import re
import urllib.request
from typing import Any

import pytest

from e2e.cluster import Cluster
from e2e.realnode import RealNode
from e2e.realnode.chartvalues import cluster_values
from e2e.realnode.imagebuild import PushedImage
from tests.integration.install.release import FORBIDDEN, TEST_OPERATOR, Release
from tests.support import wait_for

PULLED = re.compile(r"Successfully pulled image \"[^\"]+\" in [0-9.]+m?s")


def _values(cluster: Cluster, image: PushedImage, watch: dict[str, Any]) -> dict[str, Any]:
    # The real node and the API server's address on the harness bridge (no kube-proxy).
    here = cluster_values(cluster)
    return {
        **here,
        "watch": watch,
        "image": {
            "repository": f"{image.address}/{image.repository}",
            "tag": image.tag,
            "pullPolicy": "IfNotPresent",
        },
        "leaderElection": {"enabled": True},
        "operator": {**TEST_OPERATOR, **here["operator"]},
    }


def _metrics(pod_ip: str, port: int) -> str:
    # The pod's address is on the harness's own bridge; no proxy may take the request.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://{pod_ip}:{port}/metrics", timeout=10) as resp:
        return str(resp.read().decode())


@pytest.mark.parametrize("mode", ["cluster", "namespaced"])
def test_helm_install_pulls_the_operator_image_and_runs_it_non_root_read_only(
    cluster: Cluster,
    real_node: RealNode,
    operator_pushed: PushedImage,
    release: Release,
    mode: str,
) -> None:
    watch = {"mode": mode, "namespaces": [release.namespace] if mode == "namespaced" else []}
    release.install(_values(cluster, operator_pushed, watch))
    (pod,) = release.wait_running(1, timeout_s=180)
    name = pod["metadata"]["name"]
    wait_for(
        lambda: any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in release.running_pods()[0]["status"].get("conditions", [])
        ),
        120,
        "the operator pod Ready (its readiness probe answered)",
    )
    pod = cluster.get_json("pod", name, "-n", release.namespace)
    assert pod["spec"]["nodeName"] == real_node.name
    (status,) = pod["status"]["containerStatuses"]
    assert status["containerID"].startswith("containerd://")
    assert status["image"] == operator_pushed.reference
    # Pulled from the registry: containerd records the repository digest it resolved.
    assert status["imageID"].startswith(f"{operator_pushed.address}/torchflex-operator@sha256:")

    events = cluster.get_json(
        "events", "-n", release.namespace, "--field-selector", f"involvedObject.name={name}"
    )
    # The session's first install pulls; the second finds the image on the node.
    (pulled,) = [e["message"] for e in events["items"] if e.get("reason") == "Pulled"]
    assert operator_pushed.reference in pulled, pulled
    took = PULLED.search(pulled)
    assert took or "already present on machine" in pulled, pulled
    print(f"kubelet: {pulled}")

    def sh(script: str) -> tuple[int, str]:
        out = cluster.kubectl(
            "exec", name, "-n", release.namespace, "--", "sh", "-c", script, check=False
        )
        return out.returncode, out.stdout + out.stderr

    rc, ident = sh("id -u; id -g")
    assert (rc, ident.split()) == (0, ["65532", "65532"]), ident
    rc, touched = sh("touch /opt/torchflex/probe")
    assert rc != 0 and "Read-only file system" in touched, touched
    rc, tmp = sh("touch /tmp/probe && echo writable")  # the chart's emptyDir /tmp
    assert (rc, tmp.strip()) == (0, "writable"), tmp

    # Active through the Lease: the chart's POD_ID is the holder identity.
    def holder() -> str:
        out = cluster.kubectl(
            "get", "lease", release.fullname, "-n", release.namespace,
            "-o", "jsonpath={.spec.holderIdentity}", check=False,
        )  # fmt: skip
        return out.stdout.strip() if out.returncode == 0 else ""

    wait_for(lambda: holder() == name, 60, f"the Lease {release.fullname} held by {name}")
    metrics = _metrics(pod["status"]["podIP"], 8080)
    assert "torchflex_" in metrics, metrics[:500]
    # The chart's RBAC of this mode was enough: the API server denied nothing.
    log = cluster.kubectl("logs", name, "-n", release.namespace).stdout
    assert log and not [line for line in log.splitlines() if FORBIDDEN.search(line)], log[-2000:]
    release.helm("uninstall", release.name, "--wait", "--timeout", "120s")
