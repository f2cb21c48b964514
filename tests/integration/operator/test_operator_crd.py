"""The CRD on the real API server: invalid manifests rejected naming the field."""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster import Cluster

REPO = Path(__file__).resolve().parents[3]
INVALID = sorted((REPO / "tests" / "manifests" / "invalid").glob("*.yaml"))
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
CRD_SCHEMA = yaml.safe_load((REPO / "crds" / "elasticjob.yaml").read_text())["spec"]["versions"][0][
    "schema"
]["openAPIV3Schema"]


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


def readme_jobs() -> list[str]:
    """The ElasticJobs README.md offers a newcomer to copy (its ``yaml`` blocks)."""
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"^```yaml\n(.*?)^```", text, re.S | re.M)
    return [b for b in blocks if (yaml.safe_load(b) or {}).get("kind") == "ElasticJob"]


@pytest.mark.cluster
def test_the_readme_job_is_accepted_as_written(cluster: Cluster, namespace: str, crd: None) -> None:
    (job,) = readme_jobs()
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        f.write(job)
        f.flush()
        cluster.kubectl("create", "-n", namespace, "-f", f.name)
    name = yaml.safe_load(job)["metadata"]["name"]
    created = cluster.get_json("ej", name, "-n", namespace)
    assert created["spec"]["rendezvous"]["backend"] == "c10d"  # the defaults applied


def defaulted_fields(schema: Mapping[str, Any], path: str) -> Iterator[tuple[str, Any]]:
    """(dotted path, default) of every property of ``schema`` with a ``default:``."""
    for name, prop in (schema.get("properties") or {}).items():
        if "default" in prop:
            yield f"{path}.{name}", prop["default"]
        yield from defaulted_fields(prop, f"{path}.{name}")


def said(default: Any) -> str:
    """How a description states a default: scalars by value, objects by their braces."""
    if isinstance(default, bool):
        return f"Default {str(default).lower()}"
    if isinstance(default, dict):
        return "Default {"
    return f"Default {default}"


@pytest.mark.cluster
def test_kubectl_explain_states_every_default_and_the_int_or_string_type(
    cluster: Cluster, crd: None
) -> None:
    fields = dict(defaulted_fields(CRD_SCHEMA["properties"]["spec"], "elasticjob.spec"))
    assert len(fields) >= 10, fields
    missing = []
    for field, default in fields.items():
        explained = " ".join(cluster.kubectl("explain", field).stdout.split())
        if said(default) not in explained:
            missing.append(f"{field}: {said(default)!r} not in {explained!r}")
    assert not missing, "\n".join(missing)
    # kubectl's explain names no type for an int-or-string field (it prints <Object>),
    # so the description says it; OpenAPI clients read the published schema.
    explained = " ".join(cluster.kubectl("explain", "elasticjob.spec.nprocPerNode").stdout.split())
    assert "int-or-string" in explained and '"auto"' in explained, explained
    published = json.loads(
        cluster.kubectl("get", "--raw", "/openapi/v3/apis/torchflex.io/v1alpha1").stdout
    )
    job = published["components"]["schemas"]["io.torchflex.v1alpha1.ElasticJob"]
    nproc = job["properties"]["spec"]["properties"]["nprocPerNode"]
    assert nproc["x-kubernetes-int-or-string"] is True, nproc
    assert sorted(alt["type"] for alt in nproc["anyOf"]) == ["integer", "string"], nproc
    assert nproc["default"] == "auto", nproc


def two_role_job(name: str, **spec: Any) -> dict[str, Any]:
    container = {"name": "trainer", "image": "img", "command": ["python", "-c", "pass"]}
    template = {"spec": {"containers": [container]}}
    return {
        "apiVersion": "torchflex.io/v1alpha1",
        "kind": "ElasticJob",
        "metadata": {"name": name},
        "spec": {
            "roles": [
                {"name": "trainer", "minReplicas": 2, "maxReplicas": 2, "template": template},
                {"name": "reader", "minReplicas": 1, "maxReplicas": 4, "template": template},
            ],
            **spec,
        },
    }


@pytest.mark.cluster
def test_a_multi_role_job_is_accepted_and_scale_drives_its_scale_role(
    cluster: Cluster, namespace: str, crd: None, tmp_path: Path
) -> None:
    # The longest name these roles allow: <name>-trainer-1 is 63 characters.
    longest = "a-two-role-job-named-with-fifty-three-characters-abcd"
    assert len(longest) == 53
    for name, spec in (("roles-ok", {"scaleRole": "reader", "replicas": 3}), (longest, {})):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(two_role_job(name, **spec)))
        cluster.kubectl("create", "-n", namespace, "-f", str(path))
    path.write_text(json.dumps(two_role_job(longest + "e")))
    out = cluster.kubectl("create", "-n", namespace, "-f", str(path), check=False)
    assert out.returncode != 0 and "too long for the pod names" in out.stderr, out.stderr
    job = cluster.get_json("ej", "roles-ok", "-n", namespace)
    roles = job["spec"]["roles"]
    assert [r["failureScope"] for r in roles] == ["Role", "Role"]
    assert [r["nprocPerNode"] for r in roles] == ["auto", "auto"]
    assert "coupling" not in job["spec"] and "template" not in job["spec"]
    # kubectl scale moves spec.replicas within the scale role's range, and no further.
    cluster.kubectl("scale", "-n", namespace, "ej/roles-ok", "--replicas=4")
    assert cluster.get_json("ej", "roles-ok", "-n", namespace)["spec"]["replicas"] == 4
    out = cluster.kubectl("scale", "-n", namespace, "ej/roles-ok", "--replicas=5", check=False)
    assert out.returncode != 0 and "scale role" in out.stderr, out.stderr
    explained = " ".join(
        cluster.kubectl("explain", "elasticjob.spec.roles.failureScope").stdout.split()
    )
    assert "Default Role" in explained, explained
