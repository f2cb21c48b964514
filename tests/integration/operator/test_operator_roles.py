"""Multi-role jobs (spec.roles) on the real control plane: accepted by the API, not run
by the operator yet, and said so (issue 29).

kopf runs in-process (``operator`` fixture); the job's pods would go to kwok's fake
nodes, and none may be created.
"""

from __future__ import annotations

import json
import time
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
    event_messages,
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


def test_a_multi_role_job_is_accepted_not_run_and_said_so(
    cluster: Cluster, namespace: str, operator: Reconciler
) -> None:
    cluster.kwok_nodes(2, prefix="roles-kwok")
    # A job of one group beside it runs as ever: the operator is up and planning.
    apply(cluster, namespace, kwok_job("single", minReplicas=1, maxReplicas=1))
    apply(cluster, namespace, roles_job("duo"))
    wait_job_phase(cluster, namespace, "single", "Running", 60)

    def said() -> bool:
        cond = condition(get_job(cluster, namespace, "duo"), "Training")
        return cond is not None and cond["reason"] == "RolesNotRun"

    wait_for(said, 60, "Training=False RolesNotRun on the multi-role job")
    job = get_job(cluster, namespace, "duo")
    cond = condition(job, "Training")
    assert cond is not None and cond["status"] == "False"
    assert "not yet run" in cond["message"], cond
    assert job["status"]["phase"] == "Pending"
    # The scale subresource works: spec.replicas is the scale role's, written by the operator.
    assert job["spec"]["replicas"] == 2
    assert [(r["name"], r["desired"], r["ready"]) for r in job["status"]["roles"]] == [
        ("trainer", 1, 0),
        ("reader", 2, 0),
    ]
    assert job["status"]["selector"].endswith(",torchflex.io/training-role=reader")
    wide = cluster.kubectl("get", "ej", "duo", "-n", namespace, "-o", "wide").stdout
    assert "ROLES" in wide and "trainer 0/1 reader 0/2" in wide, wide
    wait_for(
        lambda: any(r == "RolesNotRun" for r, _ in event_messages(cluster, namespace, "duo")),
        30,
        "the RolesNotRun Event",
    )
    time.sleep(3)  # a few more passes (resync, status writes): still nothing of its own
    assert owned_objects(cluster, namespace, "duo") == []
    notes = [m for r, m in event_messages(cluster, namespace, "duo") if r == "RolesNotRun"]
    assert len(notes) == 1 and "spec.roles" in notes[0], notes
    assert len(live_workers(cluster, namespace, "single")) == 1


def test_each_role_s_pods_and_budget_are_valid_objects_for_the_api_server(
    cluster: Cluster, namespace: str, crd: None, tmp_path: Path
) -> None:
    # Built by the pod builder the planner will use once roles run: the API server's own
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
