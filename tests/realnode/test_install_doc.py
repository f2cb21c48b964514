"""docs/operations.md's Install section, followed as written on the real node (issue 16).

Where it sits: ``tests/realnode``. The section's fenced ``bash`` blocks are
read from the doc at test time and run by bash as they stand, so the doc
cannot drift from what was proven:

1. the settings block names ``REGISTRY`` and ``TAG``: the test gives them
   the local registry and the tag of the operator image the session built;
2. the build block's operator line is the one thing not run (no Docker on
   this machine): the ``operator_pushed`` fixture is its stand-in, buildah
   building the same Dockerfile and pushing it to the same reference,
   which the test checks against the line's ``-f`` and ``-t``;
3. the install block and the check block run verbatim, from the repository
   root. Two facts of this cluster that the doc cannot know go in a values
   file appended to ``helm install`` only (a ``helm`` shell function):
   ``e2e.realnode.chartvalues`` (the real node; the API server's address,
   as no kube-proxy serves the ``kubernetes`` Service). Nothing the doc
   sets is overridden.

Then the pod is checked: on the real node, running the pushed image,
pulled from the registry by digest, Ready, and no denied call in its log.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from e2e.cluster import Cluster
from e2e.realnode import RealNode
from e2e.realnode.chartvalues import cluster_values
from e2e.realnode.imagebuild import PushedImage
from tests.integration.install.release import CLUSTER_KINDS, FORBIDDEN, INSTANCE

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "operations.md"
# The names the doc's commands use.
NAMESPACE = "torchflex-system"
RELEASE = "torchflex"

# Appends the cluster's facts to `helm install` and to nothing else.
HELM_FOR_THIS_CLUSTER = """\
helm() {
  if [[ "${1:-}" == install ]]; then
    command helm "$@" -f "$CLUSTER_VALUES"
  else
    command helm "$@"
  fi
}
"""


def install_blocks(markdown: str) -> list[str]:
    """The ``bash`` blocks of the ``## Install`` section, in order."""
    section = markdown.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```bash\n(.*?)^```", section, re.S | re.M)


def _expand(text: str, env: dict[str, str]) -> str:
    return re.sub(r"\$(\w+)", lambda m: env[m[1]], text)


def _remove_release(cluster: Cluster, helm_env: dict[str, str]) -> None:
    helm = str(cluster.layout.bin / "helm")
    subprocess.run(
        [helm, "uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "120s"],
        env=helm_env, capture_output=True, timeout=150, check=False,
    )  # fmt: skip
    # Cluster-scoped objects of a release whose namespace went first.
    cluster.kubectl(
        "delete", CLUSTER_KINDS, "-l", f"{INSTANCE}={RELEASE}", "--ignore-not-found", check=False
    )
    cluster.kubectl(
        "delete", "namespace", NAMESPACE, "--ignore-not-found", "--timeout=120s",
        check=False, timeout=150,
    )  # fmt: skip


@pytest.fixture()
def helm_env(cluster: Cluster) -> Iterator[dict[str, str]]:
    """The cluster's env with a helm home of its own; the doc's release
    removed before (a failed earlier run) and after."""
    with tempfile.TemporaryDirectory(prefix="tf-helm-doc-") as home:
        env = {
            **cluster.env,
            "HOME": home,
            "HELM_CACHE_HOME": home,
            "HELM_CONFIG_HOME": home,
            "HELM_DATA_HOME": home,
        }
        _remove_release(cluster, env)
        try:
            yield env
        finally:
            _remove_release(cluster, env)


def test_the_install_section_runs_as_written_and_the_operator_runs_the_pushed_image(
    cluster: Cluster,
    real_node: RealNode,
    operator_pushed: PushedImage,
    helm_env: dict[str, str],
    tmp_path: Path,
) -> None:
    blocks = install_blocks(DOC.read_text())
    # The section's shape this test follows: settings, build, install, check.
    assert len(blocks) == 4, f"docs/operations.md's Install has {len(blocks)} bash blocks"
    settings, build, install, check = blocks
    given = {"REGISTRY": operator_pushed.address, "TAG": operator_pushed.tag}
    assert re.findall(r"^(\w+)=", settings, re.M) == list(given), settings

    (operator_line,) = [ln for ln in build.splitlines() if "docker/operator.Dockerfile" in ln]
    m = re.search(r'-f (\S+) -t "([^"]+)" --push \.$', operator_line)
    assert m, operator_line
    assert m[1] == "docker/operator.Dockerfile"  # what imagebuild.operator_image builds
    assert _expand(m[2], given) == operator_pushed.reference

    values = tmp_path / "cluster-values.yaml"
    values.write_text(yaml.safe_dump(cluster_values(cluster)))
    script = HELM_FOR_THIS_CLUSTER + install + check
    out = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=REPO,
        env={**helm_env, **given, "CLUSTER_VALUES": str(values)},
        capture_output=True,
        text=True,
        timeout=420,
        check=False,
    )
    shown = f"{script}\n--- stdout\n{out.stdout}\n--- stderr\n{out.stderr}"
    assert out.returncode == 0, shown
    assert "successfully rolled out" in out.stdout, shown
    assert "condition met" in out.stdout, shown
    (pod_row,) = [ln for ln in out.stdout.splitlines() if ln.startswith(f"{RELEASE}-")]
    assert pod_row.split()[1:3] == ["1/1", "Running"], shown

    (pod,) = cluster.get_json(
        "pods", "-n", NAMESPACE, "-l", f"{INSTANCE}={RELEASE},app.kubernetes.io/component=operator"
    )["items"]
    assert pod["spec"]["nodeName"] == real_node.name
    (status,) = pod["status"]["containerStatuses"]
    assert status["ready"] is True
    assert status["image"] == operator_pushed.reference
    assert status["imageID"].startswith(f"{operator_pushed.address}/torchflex-operator@sha256:")
    log = cluster.kubectl("logs", pod["metadata"]["name"], "-n", NAMESPACE).stdout
    assert log and not [ln for ln in log.splitlines() if FORBIDDEN.search(ln)], log[-2000:]
