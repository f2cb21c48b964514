"""The CRD on the real API server: invalid manifests rejected naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.cluster import Cluster

REPO = Path(__file__).resolve().parents[3]
INVALID = sorted((REPO / "tests" / "manifests" / "invalid").glob("*.yaml"))
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def expected_fragment(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name} lacks a '# expect:' line"
    return first.removeprefix("# expect: ").strip()


def test_there_are_enough_invalid_manifests() -> None:
    assert len(INVALID) >= 12
    assert len(EXAMPLES) >= 2


@pytest.mark.cluster
def test_invalid_manifests_are_rejected_naming_the_field(
    cluster: Cluster, namespace: str, crd: None
) -> None:
    wrong: list[str] = []
    for path in INVALID:
        out = cluster.kubectl("create", "-n", namespace, "-f", str(path), check=False)
        fragment = expected_fragment(path)
        if out.returncode == 0 or fragment not in out.stderr:
            wrong.append(f"{path.name}: rc={out.returncode} stderr={out.stderr.strip()!r}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.cluster
def test_examples_are_valid_and_defaults_applied(
    cluster: Cluster, namespace: str, crd: None
) -> None:
    for path in EXAMPLES:
        cluster.kubectl("create", "-n", namespace, "-f", str(path))
    job = cluster.get_json("ej", "mnist-etcd", "-n", namespace)
    assert job["spec"]["cleanPodPolicy"] == "Running"
    assert job["spec"]["rendezvous"]["joinTimeoutSeconds"] == 300
    assert job["spec"]["maxRestarts"] == 3
    c10d = cluster.get_json("ej", "mnist-c10d", "-n", namespace)
    assert c10d["spec"]["rendezvous"]["backend"] == "c10d"
    explained = cluster.kubectl("explain", "elasticjob.spec.rendezvous.backend").stdout
    assert "c10d" in explained
    # The scale subresource refuses replicas outside [min, max] too.
    out = cluster.kubectl("scale", "-n", namespace, "ej/mnist-c10d", "--replicas=9", check=False)
    assert out.returncode != 0 and "spec.replicas" in out.stderr
