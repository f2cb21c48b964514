"""The chart renders what each value set asks for: lint, args, security, RBAC objects.

Offline ``helm lint --strict`` / ``helm template`` with the pinned helm; the
rendered operator args are parsed by the operator's own CLI parser, so a flag
the chart passes and the operator lacks fails here, not in a cluster.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.unit.install.chart import (
    CHART,
    KUBE,
    NAMESPACE,
    VALUE_SETS,
    find,
    helm,
    one,
    operator_container,
    render,
)
from torchflex_operator import cli
from torchflex_operator.planning.lease import Timing


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_helm_lint_strict(name: str) -> None:
    out = helm(
        "lint", "--strict", str(CHART), "--namespace", NAMESPACE, *KUBE, values=VALUE_SETS[name]
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 chart(s) failed" in out.stdout


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_rendered_args_parse_with_the_operator_cli(name: str) -> None:
    container = operator_container(render(VALUE_SETS[name]))
    assert container["command"] == ["torchflex-operator"]
    args = cli.parser().parse_args(container["args"])
    settings = cli.settings_from(args)
    values = VALUE_SETS[name].get("operator", {})
    assert settings.agent_command == values.get("agentCommand", "torchflex-agent")
    assert args.log_format == values.get("logFormat", "json")


def test_default_is_clusterwide_standalone_with_recreate() -> None:
    docs = render({})
    args = cli.parser().parse_args(operator_container(docs)["args"])
    assert args.all_namespaces and not args.namespace
    assert args.standalone and args.lease is None and args.peering is None
    assert cli.lease_config(args, NAMESPACE) is None
    dep = one(docs, "Deployment")
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    assert not find(docs, "Role") and not find(docs, "PodDisruptionBudget")
    assert {d["kind"] for d in docs} == {
        "Deployment",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Service",
    }


def test_namespaced_mode_watches_exactly_the_listed_namespaces() -> None:
    docs = render(VALUE_SETS["namespaced"])
    args = cli.parser().parse_args(operator_container(docs)["args"])
    assert args.namespace == ["team-a", "team-b"] and not args.all_namespaces
    roles = find(docs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for binding in find(docs, "RoleBinding"):
        assert binding["roleRef"]["kind"] == "Role"
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "tf-torchflex", "namespace": NAMESPACE}
        ]
    # Worker ServiceAccounts follow the watched namespaces.
    workers = [
        s for s in find(docs, "ServiceAccount") if s["metadata"]["name"] == "torchflex-worker"
    ]
    assert sorted(s["metadata"]["namespace"] for s in workers) == ["team-a", "team-b"]


LEASE_RULE = {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"]}


def test_ha_elects_through_a_lease_with_rolling_update_and_pdb() -> None:
    docs = render(VALUE_SETS["ha"])
    container = operator_container(docs)
    args = cli.parser().parse_args(container["args"])
    lease = cli.lease_config(args, None)
    assert lease == cli.LeaseConfig(NAMESPACE, "tf-torchflex", Timing(15, 10.0, 2.0))
    assert not args.standalone and cli.deprecations(args) == []
    # Its own Lease only: create (not limitable by name), then get/update of that name.
    role = one(docs, "Role", "tf-torchflex-leader-election")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [
        {**LEASE_RULE, "verbs": ["create"]},
        {**LEASE_RULE, "resourceNames": [lease.name], "verbs": ["get", "update"]},
    ]
    binding = one(docs, "RoleBinding", "tf-torchflex-leader-election")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0]["name"] == "tf-torchflex"
    assert not [d for d in docs if d["apiVersion"].startswith("kopf.dev")]
    dep = one(docs, "Deployment")
    assert dep["spec"]["replicas"] == 3
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 2
    assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]


def test_namespaced_ha_keeps_its_lease_in_the_release_namespace() -> None:
    docs = render(VALUE_SETS["namespaced-ha"])
    args = cli.parser().parse_args(operator_container(docs)["args"])
    lease = cli.lease_config(args, None)
    assert lease is not None and (lease.namespace, lease.name) == (NAMESPACE, "tf-torchflex")
    role = one(docs, "Role", "tf-torchflex-leader-election")
    assert role["metadata"]["namespace"] == NAMESPACE


def test_peering_values_of_earlier_charts_still_turn_election_on() -> None:
    timing = {"leaseDurationSeconds": 30, "renewDeadlineSeconds": 20, "retryPeriodSeconds": 4}
    docs = render({"peering": {"enabled": True, "name": "old"}, "leaderElection": timing})
    args = cli.parser().parse_args(operator_container(docs)["args"])
    assert cli.lease_config(args, None) == cli.LeaseConfig(NAMESPACE, "old", Timing(30, 20, 4))
    assert one(docs, "Deployment")["spec"]["replicas"] == 1
    assert not find(render({"peering": {"enabled": False}}), "Role")


def test_operator_pod_is_restricted_non_root_with_probes_and_resources() -> None:
    docs = render({})
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    container = operator_container(docs)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    args = cli.parser().parse_args(container["args"])
    assert ports == {"health": args.health_port, "metrics": args.metrics_port}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]


def test_metrics_service_targets_the_metrics_port() -> None:
    docs = render({})
    svc = one(docs, "Service")
    dep = one(docs, "Deployment")
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["ports"] == [
        {"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}
    ]


def test_minimal_drops_metrics_and_pins_the_digest() -> None:
    docs = render(VALUE_SETS["minimal"])
    container = operator_container(docs)
    args = cli.parser().parse_args(container["args"])
    assert args.metrics_port == 0 and not args.watch_nodes and not args.agent_status_poll
    assert not find(docs, "Service")
    assert container["image"] == "ghcr.io/torchflex/torchflex-operator@sha256:" + "ab" * 32
    assert [p["name"] for p in container["ports"]] == ["health"]


def test_image_tag_defaults_to_app_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    image = operator_container(render({}))["image"]
    assert image == f"ghcr.io/torchflex/torchflex-operator:{chart['appVersion']}"
    image = operator_container(render({"image": {"tag": "0.2.0"}}))["image"]
    assert image.endswith(":0.2.0")


def test_worker_service_account_has_no_permissions_by_default() -> None:
    docs = render({})
    worker = one(docs, "ServiceAccount", "torchflex-worker")
    assert worker["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"
    assert worker["metadata"]["namespace"] == NAMESPACE
    assert worker["automountServiceAccountToken"] is False
    assert not find(docs, "Role")
    bound = [
        s["name"]
        for b in find(docs, "RoleBinding") + find(docs, "ClusterRoleBinding")
        for s in b["subjects"]
    ]
    assert "torchflex-worker" not in bound


def test_worker_rules_value_grants_exactly_those_rules() -> None:
    docs = render(VALUE_SETS["worker-rbac"])
    sa = one(docs, "ServiceAccount", "torchflex-worker")
    assert sa["metadata"]["namespace"] == "ml" and sa["automountServiceAccountToken"] is True
    role = one(docs, "Role", "torchflex-worker")
    assert role["rules"] == VALUE_SETS["worker-rbac"]["workerServiceAccount"]["rules"]
    binding = one(docs, "RoleBinding", "torchflex-worker")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "torchflex-worker", "namespace": "ml"}
    ]
    operator_sa = one(docs, "ServiceAccount", "tf-torchflex")
    assert operator_sa["metadata"]["annotations"] == {"iam.example.com/role": "torchflex"}


def test_every_object_carries_the_release_labels() -> None:
    for name, values in VALUE_SETS.items():
        for doc in render(values):
            labels: dict[str, Any] = doc["metadata"]["labels"]
            assert labels["app.kubernetes.io/instance"] == "tf", (name, doc["kind"])
            assert labels["app.kubernetes.io/managed-by"] == "Helm", (name, doc["kind"])
