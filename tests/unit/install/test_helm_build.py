"""The pinned helm is built the way helm's own Makefile builds it.

Where it sits: unit tier (offline ``helm template``). helm stamps the
Kubernetes version its client-go speaks into its default capabilities at
link time; a plain ``go install`` leaves v1.20.0, and the chart's
``kubeVersion: >=1.30`` then refuses to render without ``--kube-version``.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from e2e.toolchain.versions import KUBERNETES_VERSION
from tests.unit.install.chart import CHART, NAMESPACE, RELEASE, helm


def test_helm_template_renders_the_chart_without_kube_version() -> None:
    out = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE)
    assert out.returncode == 0, out.stderr
    kinds = {d["kind"] for d in yaml.safe_load_all(out.stdout) if d}
    assert "Deployment" in kinds


def test_helm_default_kube_version_is_its_client_go_minor(tmp_path: Path) -> None:
    chart = tmp_path / "probe"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: probe\nversion: 0.1.0\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: probe\n"
        "data:\n  kube: {{ .Capabilities.KubeVersion.Version | quote }}\n"
    )
    out = helm("template", "probe", str(chart))
    assert out.returncode == 0, out.stderr
    (doc,) = [d for d in yaml.safe_load_all(out.stdout) if d]
    # helm v3.22 speaks client-go v0.37: Kubernetes v1.37, the minor we pin.
    minor = KUBERNETES_VERSION.split(".")[1]
    assert doc["data"]["kube"] == f"v1.{minor}.0"
