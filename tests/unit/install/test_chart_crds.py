"""The chart's CRDs: the ElasticJob CRD never drifts from crds/, and the peering
CRDs are the ones kopf looks for.

Helm installs files of the chart's crds/ verbatim (never templated), so a
byte comparison is the drift check; to sync after a CRD change:
``cp crds/elasticjob.yaml helm/torchflex/crds/``.
"""

from __future__ import annotations

from typing import Any

import yaml
from kopf._cogs.structs import references

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


def test_template_with_crds_ships_elasticjob_and_both_peering_crds() -> None:
    assert set(_crds()) == {
        "elasticjobs.torchflex.io",
        "clusterkopfpeerings.kopf.dev",
        "kopfpeerings.kopf.dev",
    }


def test_peering_crds_match_kopfs_selectors() -> None:
    crds = _crds()
    for selector, scope in (
        (references.CLUSTER_PEERINGS_K, "Cluster"),
        (references.NAMESPACED_PEERINGS_K, "Namespaced"),
    ):
        crd = crds[f"{selector.any_name}.{selector.group}"]
        assert crd["spec"]["names"]["plural"] == selector.any_name
        assert crd["spec"]["scope"] == scope
        assert [v["name"] for v in crd["spec"]["versions"]] == [selector.version]
        status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
        # kopf writes one key per peer identity under .status.
        assert status["x-kubernetes-preserve-unknown-fields"] is True


def test_crd_files_parse_as_yaml() -> None:
    for path in (CHART / "crds").glob("*.yaml"):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        assert docs and all(d["kind"] == "CustomResourceDefinition" for d in docs), path
