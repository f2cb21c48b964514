"""The chart's tenancy objects on the real API server: aggregated roles and the admission policy.

- The aggregated ClusterRoles reach the built-in roles through the real
  clusterrole-aggregation controller: a user bound to ``edit`` may create
  ElasticJobs (it may create pods already), one bound to ``view`` may only read them.
- The optional ValidatingAdmissionPolicy (``admissionPolicy.enabled``) is
  compiled and enforced by the real kube-apiserver: an ElasticJob whose
  template names a ServiceAccount or a hostPath outside what the values allow
  is refused with a message naming the field, and an allowed one is admitted.

Only the chart's tenancy objects are applied (rendered by the pinned helm), the
binding is limited to the test's namespace, and everything cluster-scoped is
deleted afterwards, so other tests on the same cluster never meet the policy.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from e2e.cluster import Cluster
from e2e.workload import apply_crd
from tests.support import wait_for
from tests.unit.install.chart import find, render
from torchflex_contract import labels

JOB: dict[str, Any] = {
    "apiVersion": labels.API_VERSION,
    "kind": labels.KIND,
    "metadata": {"name": "j"},
    "spec": {
        "minReplicas": 1,
        "maxReplicas": 1,
        "template": {
            "spec": {"containers": [{"name": "trainer", "image": "img", "command": ["python"]}]}
        },
    },
}


def _apply_cluster_objects(cluster: Cluster, docs: list[dict[str, Any]]) -> Iterator[None]:
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    try:
        yield
    finally:
        for doc in docs:
            cluster.kubectl(
                "delete", doc["kind"], doc["metadata"]["name"], "--ignore-not-found", check=False
            )


@pytest.fixture()
def policy(cluster: Cluster, namespace: str) -> Iterator[None]:
    apply_crd(cluster)
    values = {
        "admissionPolicy": {
            "enabled": True,
            "allowedServiceAccounts": ["torchflex-worker"],
            "allowedHostPathPrefixes": ["/data/shared"],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        }
    }
    docs = find(render(values), "ValidatingAdmissionPolicy") + find(
        render(values), "ValidatingAdmissionPolicyBinding"
    )
    assert len(docs) == 2
    yield from _apply_cluster_objects(cluster, docs)


def _job(service_account: str | None = None, host_paths: tuple[str, ...] = ()) -> str:
    job = copy.deepcopy(JOB)
    pod = job["spec"]["template"]["spec"]
    if service_account is not None:
        pod["serviceAccountName"] = service_account
    if host_paths:
        pod["volumes"] = [
            {"name": f"v{i}", "hostPath": {"path": path}} for i, path in enumerate(host_paths)
        ]
    return yaml.safe_dump(job)


def _create(cluster: Cluster, namespace: str, manifest: str) -> tuple[bool, str]:
    """Server-side dry-run create: (admitted, the server's message)."""
    out = cluster.kubectl(
        "create", "--dry-run=server", "-n", namespace, "-f", "-", input=manifest, check=False
    )
    return out.returncode == 0, out.stderr.strip()


@pytest.mark.usefixtures("policy")
def test_policy_refuses_service_accounts_and_host_paths_outside_the_allowed(
    cluster: Cluster, namespace: str
) -> None:
    # The API server loads and type-checks the policy asynchronously: wait until it bites.
    wait_for(
        lambda: not _create(cluster, namespace, _job("admin"))[0],
        60,
        "the admission policy refusing serviceAccountName admin",
    )
    admitted, message = _create(cluster, namespace, _job("admin"))
    assert not admitted
    assert "spec.template.spec.serviceAccountName" in message, message
    assert "torchflex-worker only" in message and "admin" in message, message

    admitted, message = _create(cluster, namespace, _job(host_paths=("/etc",)))
    assert not admitted
    assert "hostPath /etc is not allowed" in message, message
    assert "allowed under /data/shared" in message, message
    # A prefix is a directory, not a string prefix.
    admitted, message = _create(cluster, namespace, _job(host_paths=("/data/sharedx",)))
    assert not admitted, "a sibling of the allowed directory must be refused"

    admitted, message = _create(
        cluster, namespace, _job("torchflex-worker", ("/data/shared", "/data/shared/ckpt"))
    )
    assert admitted, message
    admitted, message = _create(cluster, namespace, _job())
    assert admitted, message


@pytest.fixture()
def user_roles(cluster: Cluster) -> Iterator[None]:
    docs = [
        d
        for d in render({})
        if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith(("-edit", "-view"))
    ]
    assert len(docs) == 2
    yield from _apply_cluster_objects(cluster, docs)


def _can(cluster: Cluster, namespace: str, user: str, verb: str) -> bool:
    out = cluster.kubectl(
        "auth", "can-i", verb, "elasticjobs.torchflex.io", "-n", namespace, f"--as={user}",
        check=False,
    )  # fmt: skip
    return out.stdout.strip() == "yes"


@pytest.mark.usefixtures("user_roles")
def test_edit_may_create_elasticjobs_and_view_may_only_read(
    cluster: Cluster, namespace: str
) -> None:
    for user, role in (("alice", "edit"), ("bob", "view")):
        cluster.kubectl(
            "create", "rolebinding", f"{user}-{role}", f"--clusterrole={role}", f"--user={user}",
            "-n", namespace,
        )  # fmt: skip
    wait_for(
        lambda: _can(cluster, namespace, "alice", "create"), 60, "edit aggregating ElasticJobs"
    )
    assert _can(cluster, namespace, "alice", "delete")
    # edit grants pod create too: ElasticJob create adds nothing edit did not have.
    pods = cluster.kubectl(
        "auth", "can-i", "create", "pods", "-n", namespace, "--as=alice", check=False
    )
    assert pods.stdout.strip() == "yes"
    wait_for(lambda: _can(cluster, namespace, "bob", "list"), 60, "view aggregating ElasticJobs")
    assert not _can(cluster, namespace, "bob", "create")
    edit = cluster.get_json("clusterrole", "edit")
    rules = json.dumps(edit["rules"])
    assert labels.PLURAL in rules
