"""The chart's CRDs: only the ElasticJob CRD (leader election uses a built-in Lease),
and it never drifts from crds/.

Helm installs files of the chart's crds/ verbatim (never templated), so a
byte comparison is the drift check; to sync after a CRD change:
``cp crds/elasticjob.yaml helm/torchflex/crds/``.
"""

from __future__ import annotations

from typing import Any

import yaml

from tests.unit.install.chart import CHART, REPO, render


def test_chart_crd_is_a_byte_copy_of_the_source() -> None:
    source = (REPO / "crds" / "elasticjob.yaml").read_bytes()
    copy = (CHART / "crds" / "elasticjob.yaml").read_bytes()
    assert copy == source, (
        "helm/torchflex/crds/elasticjob.yaml drifted from crds/elasticjob.yaml: "
        "cp crds/elasticjob.yaml helm/torchflex/crds/"
    )


def _crds() -> dict[str, dict[str, Any]]:
    docs = render({}, crds=True)
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "CustomResourceDefinition"}


def test_template_with_crds_ships_only_the_elasticjob_crd() -> None:
    assert set(_crds()) == {"elasticjobs.torchflex.io"}
    assert [p.name for p in (CHART / "crds").iterdir()] == ["elasticjob.yaml"]


def test_crd_files_parse_as_yaml() -> None:
    for path in (CHART / "crds").glob("*.yaml"):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        assert docs and all(d["kind"] == "CustomResourceDefinition" for d in docs), path
