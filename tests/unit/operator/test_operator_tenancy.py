"""Tenancy in the pure layer: the per-job NetworkPolicy and the pods' ServiceAccount token.

What the cross-namespace attack needs to fail (proved on a real enforcer in
tests/e2e/test_tenancy.py) is decided here: which pods the policy selects, who
may reach them, when the planner creates or deletes it, and that no owned pod
mounts an API token the template did not ask for.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.operator.factories import NAME, NOW, NS, job, observed, worker
from torchflex_contract import env, labels
from torchflex_contract.labels import Label
from torchflex_operator.model.settings import Settings
from torchflex_operator.model.status import JobStatus
from torchflex_operator.planning import plan
from torchflex_operator.render import backends, builders, manifests, netpol

POLICY = labels.network_policy_name(NAME)
TEMPLATE_SPEC: dict[str, Any] = {
    "containers": [{"name": "trainer", "image": "img", "command": ["python", "train.py"]}]
}


def test_policy_selects_every_pod_of_the_job_and_admits_only_the_job() -> None:
    policy = netpol.network_policy(job(), Settings())
    assert policy["apiVersion"] == "networking.k8s.io/v1"
    assert policy["kind"] == "NetworkPolicy"
    assert policy["metadata"]["name"] == POLICY
    assert policy["metadata"]["namespace"] == NS
    # Owned by the job (garbage-collected with it) and labelled for the operator's watch.
    assert policy["metadata"]["ownerReferences"] == [manifests.owner_ref(job())]
    assert policy["metadata"]["labels"][Label.MANAGED_BY.value] == labels.MANAGED_BY_VALUE
    spec = policy["spec"]
    # Workers, store and etcd pods all carry the job-name label: one selector covers all.
    assert spec["podSelector"] == {"matchLabels": {Label.JOB_NAME.value: NAME}}
    assert spec["policyTypes"] == ["Ingress"]
    # Without an operator identity: one rule, the job's own pods (same namespace), any port.
    assert spec["ingress"] == [
        {"from": [{"podSelector": {"matchLabels": {Label.JOB_NAME.value: NAME}}}]}
    ]


def test_selector_matches_every_owned_pod_role() -> None:
    selector = netpol.network_policy(job(), Settings())["spec"]["podSelector"]["matchLabels"]
    c10d = job()
    etcd = job(rendezvous={"backend": "etcd", "managedEtcd": True})
    pods = [
        builders.worker_pod(c10d, 0, Settings()),
        backends.store_pod(c10d, Settings()),
        backends.etcd_pod(etcd, Settings()),
    ]
    for pod in pods:
        assert selector.items() <= pod["metadata"]["labels"].items(), pod["metadata"]["name"]


def test_operator_pods_and_cidrs_reach_only_the_health_port() -> None:
    settings = Settings(
        operator_namespace="torchflex-system",
        operator_pod_labels=(("app.kubernetes.io/name", "torchflex"),),
        operator_cidrs=("192.0.2.0/24",),
    )
    rules = netpol.network_policy(job(), settings)["spec"]["ingress"]
    assert len(rules) == 2
    operator_rule = rules[1]
    assert operator_rule["ports"] == [{"protocol": "TCP", "port": env.DEFAULT_HEALTH_PORT}]
    assert operator_rule["from"] == [
        {
            "namespaceSelector": {
                "matchLabels": {"kubernetes.io/metadata.name": "torchflex-system"}
            },
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "torchflex"}},
        },
        {"ipBlock": {"cidr": "192.0.2.0/24"}},
    ]


def test_namespace_without_labels_names_no_operator_peer() -> None:
    # A namespace alone would admit every pod there: refuse to widen the rule.
    settings = Settings(operator_namespace="torchflex-system")
    assert len(netpol.network_policy(job(), settings)["spec"]["ingress"]) == 1


def test_planner_creates_the_policy_by_default() -> None:
    result = plan(job(), JobStatus(), observed(worker(0), worker(1)), NOW)
    assert [p["metadata"]["name"] for p in result.create_network_policies] == [POLICY]
    assert result.delete_network_policies == []


def test_planner_leaves_an_observed_policy_alone() -> None:
    obs = observed(worker(0), worker(1), network_policies=frozenset({POLICY}))
    result = plan(job(), JobStatus(), obs, NOW)
    assert result.create_network_policies == []
    assert result.delete_network_policies == []


def test_opt_out_creates_nothing_and_deletes_an_existing_policy() -> None:
    off = job(networkPolicy={"enabled": False})
    assert off.network_policy is False
    fresh = plan(off, JobStatus(), observed(worker(0), worker(1)), NOW)
    assert fresh.create_network_policies == []
    assert fresh.delete_network_policies == []
    had = plan(
        off, JobStatus(), observed(worker(0), worker(1), network_policies=frozenset({POLICY})), NOW
    )
    assert had.delete_network_policies == [POLICY]


def test_default_is_on_for_objects_without_the_field() -> None:
    assert job().network_policy is True
    assert job(networkPolicy={}).network_policy is True


@pytest.mark.parametrize("role", ["worker", "store", "etcd"])
def test_owned_pods_mount_no_token_by_default(role: str) -> None:
    assert _pod(role, TEMPLATE_SPEC)["spec"]["automountServiceAccountToken"] is False


@pytest.mark.parametrize("role", ["worker", "store", "etcd"])
def test_template_asking_for_a_token_wins(role: str) -> None:
    spec = {**TEMPLATE_SPEC, "automountServiceAccountToken": True, "serviceAccountName": "sa"}
    pod = _pod(role, spec)
    assert pod["spec"]["automountServiceAccountToken"] is True
    assert pod["spec"]["serviceAccountName"] == "sa"


def _pod(role: str, template_spec: dict[str, Any]) -> dict[str, Any]:
    rdzv = {"backend": "etcd", "managedEtcd": True} if role == "etcd" else {}
    spec = job(template={"spec": template_spec}, rendezvous=rdzv)
    if role == "worker":
        return builders.worker_pod(spec, 0, Settings())
    if role == "store":
        return backends.store_pod(spec, Settings())
    return backends.etcd_pod(spec, Settings())
