"""The CRD's rendezvous backends are the contract's: the enum and the CEL rules.

``spec.rendezvous.backend`` is validated by the API server from the CRD and
parsed by the operator into ``torchflex_contract.rendezvous_backends``; a name
added, renamed or dropped on one side only fails here, for the source CRD and
for the chart's copy alike. (The default is tied to the operator's and the
agent's by tests/unit/test_defaults.py.)
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.install.chart import CHART, REPO
from torchflex_contract.rendezvous_backends import SPEC_BACKENDS

CRDS = [REPO / "crds" / "elasticjob.yaml", CHART / "crds" / "elasticjob.yaml"]


def _rendezvous_schema(path: Path) -> dict[str, Any]:
    crd = yaml.safe_load(path.read_text())
    (version,) = crd["spec"]["versions"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    schema: dict[str, Any] = spec["properties"]["rendezvous"]
    return schema


@pytest.mark.parametrize("path", CRDS, ids=["crds", "helm"])
def test_crd_backend_enum_is_the_contracts(path: Path) -> None:
    backend = _rendezvous_schema(path)["properties"]["backend"]
    assert backend["enum"] == [b.value for b in SPEC_BACKENDS]


@pytest.mark.parametrize("path", CRDS, ids=["crds", "helm"])
def test_crd_validation_rules_name_only_contract_backends(path: Path) -> None:
    rules = [r["rule"] for r in _rendezvous_schema(path)["x-kubernetes-validations"]]
    named = {m for rule in rules for m in re.findall(r"self\.backend [!=]= '([^']*)'", rule)}
    assert named, rules  # the rules do compare backends: a changed spelling must not pass unseen
    assert named <= {b.value for b in SPEC_BACKENDS}
