"""Rendering the Helm chart with the pinned helm binary, for the install unit tests.

Where it sits: imported by ``tests/unit/install/test_*.py`` (no cluster: ``helm
template`` and ``helm lint`` run offline) and by the install integration tests
for their value sets. The helm binary is the one ``e2e/toolchain/build.sh``
builds at the version pinned in ``e2e/toolchain/versions.env``.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.toolchain.versions import KUBERNETES_VERSION

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "helm" / "torchflex"
RELEASE = "tf"
# Render for the exact version the local control plane runs (the pinned helm's
# own default is its client-go minor, see test_helm_build.py).
KUBE = ("--kube-version", KUBERNETES_VERSION)
NAMESPACE = "torchflex-system"

# Value sets every lint/template test runs against: each one turns on a different part.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "default": {},
    "namespaced": {"watch": {"mode": "namespaced", "namespaces": ["team-a", "team-b"]}},
    "ha": {
        "replicaCount": 3,
        "podDisruptionBudget": {"enabled": True, "minAvailable": 2},
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {
                                "matchLabels": {"app.kubernetes.io/name": "torchflex"}
                            },
                        },
                    }
                ]
            }
        },
    },
    "namespaced-ha": {
        "replicaCount": 2,
        "watch": {"mode": "namespaced", "namespaces": ["team-a"]},
    },
    "minimal": {
        "metrics": {"enabled": False},
        "operator": {"watchNodes": False, "agentStatusPoll": False, "logFormat": "plain"},
        "workerServiceAccount": {"create": False},
        "image": {"digest": "sha256:" + "ab" * 32},
    },
    "monitoring": {
        "metrics": {
            "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}, "interval": "30s"},
            "prometheusRule": {
                "enabled": True,
                "labels": {"release": "prom"},
                "alertLabels": {"team": "ml-platform"},
            },
            "grafanaDashboard": {"enabled": True, "namespace": "monitoring"},
        }
    },
    "worker-rbac": {
        "workerServiceAccount": {
            "namespaces": ["ml"],
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}],
        },
        "serviceAccount": {"annotations": {"iam.example.com/role": "torchflex"}},
    },
}


def toolchain_bin() -> Path:
    out = subprocess.run(
        ["bash", str(REPO / "e2e" / "toolchain" / "build.sh"), "--print"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip().splitlines()[-1])


def helm_path() -> Path:
    path = toolchain_bin() / "helm"
    if not path.exists():
        pytest.fail(f"helm is not built yet ({path}): run `make toolchain` first")
    return path


def helm(*args: str, values: Mapping[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    """Run helm with ``values`` in a temporary values file; never raises on exit status."""
    with tempfile.TemporaryDirectory(prefix="tf-helm-") as tmp:
        extra: list[str] = []
        if values is not None:
            vfile = Path(tmp) / "values.yaml"
            vfile.write_text(yaml.safe_dump(dict(values)))
            extra = ["-f", str(vfile)]
        env = {
            "HOME": tmp,
            "HELM_CACHE_HOME": tmp,
            "HELM_CONFIG_HOME": tmp,
            "PATH": "/usr/bin:/bin",
        }
        return subprocess.run(
            [str(helm_path()), *args, *extra],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )


def render(values: Mapping[str, Any], *, crds: bool = False) -> list[dict[str, Any]]:
    """``helm template`` → the rendered objects (CRDs only with ``crds``)."""
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, *KUBE]
    if crds:
        args.append("--include-crds")
    out = helm(*args, values=values)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def render_error(values: Mapping[str, Any]) -> str:
    """The error of a ``helm template`` that must fail."""
    out = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, *KUBE, values=values)
    assert out.returncode != 0, f"rendered although it should fail:\n{out.stdout[:2000]}"
    return out.stderr


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = find(docs, kind, name)
    assert len(found) == 1, f"{len(found)} {kind} objects named {name}: {found}"
    return found[0]


def operator_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    dep = one(docs, "Deployment")
    containers: list[dict[str, Any]] = dep["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["operator"]
    return containers[0]


def rules_of(obj: Mapping[str, Any]) -> set[tuple[str, str, str]]:
    """A Role/ClusterRole's rules flattened to (apiGroup, resource, verb)."""
    out: set[tuple[str, str, str]] = set()
    for rule in obj.get("rules") or []:
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                for verb in rule.get("verbs", []):
                    out.add((group, resource, verb))
    return out
