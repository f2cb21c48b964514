"""Multi-role jobs (spec.roles) on the real control plane: every role's pods run, the
scale role alone follows ``kubectl scale`` (issue 29).

kopf runs in-process (``operator`` fixture); the job's pods go to kwok's fake nodes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import Cluster
from tests.integration.operator.conftest import TEST_SETTINGS
from tests.integration.operator.jobs import (
    KWOK_TOLERATION,
    SLEEP,
    apply,
    condition,
    get_job,
    kwok_job,
    live_workers,
    wait_job_phase,
)
from tests.support import wait_for
from torchflex_contract import labels
from torchflex_operator.model.spec import JobSpec
from torchflex_operator.render import builders, pdb
from torchflex_operator.runtime.reconcile import Reconciler

pytestmark = pytest.mark.cluster


def roles_job(name: str, **spec: Any) -> dict[str, Any]:
    template = {
        "spec": {
            "nodeSelector": {"type": "kwok"},
            "tolerations": [KWOK_TOLERATION],
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "trainer", "image": "fake", "command": SLEEP}],
        }
    }
    return {
        "apiVersion": labels.API_VERSION,
        "kind": labels.KIND,
        "metadata": {"name": name},
        "spec": {
            "roles": [
                {"name": "trainer", "minReplicas": 1, "maxReplicas": 1, "template": template},
                {"name": "reader", "minReplicas": 1, "maxReplicas": 2, "template": template},
            ],
            "scaleRole": "reader",
            **spec,
        },
    }


def owned_objects(cluster: Cluster, namespace: str, name: str) -> list[str]:
    selector = f"{labels.Label.JOB_NAME}={name}"
    out = cluster.kubectl(
        "get", "pods,services,networkpolicies,pdb", "-n", namespace, "-o", "name", "-l", selector
    )
    return out.stdout.split()


def role_pods(cluster: Cluster, namespace: str, name: str, role: str) -> list[str]:
    return sorted(
        p for p in live_workers(cluster, namespace, name) if p.startswith(f"{name}-{role}-")
    )


def test_a_multi_role_job_runs_every_role_and_scales_its_scale_role_only(
    cluster: Cluster, namespace: str, operator: Reconciler
) -> None:
    cluster.kwok_nodes(2, prefix="roles-kwok")
    # A job of one group beside it runs as ever.
    apply(cluster, namespace, kwok_job("single", minReplicas=1, maxReplicas=1))
    apply(cluster, namespace, roles_job("duo"))
    wait_job_phase(cluster, namespace, "single", "Running", 60)
    wait_job_phase(cluster, namespace, "duo", "Running", 90)
    assert role_pods(cluster, namespace, "duo", "trainer") == ["duo-trainer-0"]
    assert role_pods(cluster, namespace, "duo", "reader") == ["duo-reader-0", "duo-reader-1"]
    job = get_job(cluster, namespace, "duo")
    # The scale subresource works: spec.replicas is the scale role's, written by the operator.
    assert job["spec"]["replicas"] == 2
    assert job["status"]["selector"].endswith(",torchflex.io/training-role=reader")
    wait_for(
        lambda: (
            [
                (r["name"], r["desired"], r["ready"])
                for r in get_job(cluster, namespace, "duo")["status"]["roles"]
            ]
            == [("trainer", 1, 1), ("reader", 2, 2)]
        ),
        60,
        "status.roles: every role ready",
    )
    wide = cluster.kubectl("get", "ej", "duo", "-n", namespace, "-o", "wide").stdout
    assert "ROLES" in wide and "trainer 1/1 reader 2/2" in wide, wide
    cond = condition(get_job(cluster, namespace, "duo"), "MinAvailable")
    assert cond is not None and cond["status"] == "True", cond
    assert "role trainer: " in cond["message"] and "role reader: " in cond["message"], cond
    # One store pod for the job, whatever the number of roles.
    objects = owned_objects(cluster, namespace, "duo")
    assert [o for o in objects if o.startswith("pod/duo-store")] == ["pod/duo-store"]
    # A budget per role.
    assert sorted(o for o in objects if o.startswith("poddisruptionbudget")) == [
        "poddisruptionbudget.policy/duo-reader",
        "poddisruptionbudget.policy/duo-trainer",
    ]
    # kubectl scale drives the scale role (reader) and leaves the trainer as it is.
    cluster.kubectl("scale", "ej", "duo", "-n", namespace, "--replicas=1")
    wait_for(
        lambda: role_pods(cluster, namespace, "duo", "reader") == ["duo-reader-0"],
        60,
        "the reader role scaled down to one pod",
    )
    assert role_pods(cluster, namespace, "duo", "trainer") == ["duo-trainer-0"]
    assert len(live_workers(cluster, namespace, "single")) == 1


def test_each_role_s_pods_and_budget_are_valid_objects_for_the_api_server(
    cluster: Cluster, namespace: str, crd: None, tmp_path: Path
) -> None:
    # Built by the pod builder the planner uses for each role: the API server's own
    # validation (names, hostnames, labels, env) accepts every one (dry run: nothing made).
    # The longest name the CRD lets these roles have: both highest pods are 63 characters.
    obj = roles_job("a-two-role-job-named-with-fifty-three-characters-abcd")
    obj["metadata"] |= {"namespace": namespace, "uid": "0123456789abcdef"}
    obj["spec"]["roles"][1]["maxReplicas"] = 100
    job = JobSpec.parse(obj)
    made = []
    for view in job.role_views():
        made.append(builders.worker_pod(view, view.max_replicas - 1, TEST_SETTINGS))
        made.append(pdb.pod_disruption_budget(view))
    for manifest in made:
        manifest["metadata"].pop("ownerReferences")  # the job is not in the API server
        path = tmp_path / f"{manifest['metadata']['name']}.json"
        path.write_text(json.dumps(manifest))
        out = cluster.kubectl("create", "--dry-run=server", "-f", str(path), check=False)
        assert out.returncode == 0, out.stderr
    names = [m["metadata"]["name"] for m in made]
    assert names[0].endswith("-trainer-0") and names[2].endswith("-reader-99")
    assert [len(n) for n in names[::2]] == [63, 63]
