"""The chart's tenancy pieces as rendered: who the operator is to each job's
NetworkPolicy, the aggregated user roles, and the admission policy being opt-in.

The policy's behaviour is proved on a real API server in
tests/integration/install/test_tenancy_rbac_and_policy.py; here only what the
templates produce for each value set.
"""

from __future__ import annotations

from tests.unit.install.chart import NAMESPACE, VALUE_SETS, find, one, operator_container, render
from torchflex_operator import cli


def test_operator_names_its_own_pods_for_the_network_policies() -> None:
    for name, values in VALUE_SETS.items():
        docs = render(values)
        settings = cli.settings_from(cli.parser().parse_args(operator_container(docs)["args"]))
        pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
        assert settings.operator_namespace == NAMESPACE, name
        # Every label the policies require is on the operator's pods: the peer matches them.
        assert settings.operator_pod_labels, name
        assert dict(settings.operator_pod_labels).items() <= pod_labels.items(), name


def test_user_roles_aggregate_into_edit_and_view_and_say_what_they_are() -> None:
    docs = render({})
    edit = one(docs, "ClusterRole", "tf-torchflex-torchflex-system-edit")
    view = one(docs, "ClusterRole", "tf-torchflex-torchflex-system-view")
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert edit["metadata"]["labels"]["torchflex.io/equivalent-to"] == "pod-create"
    assert "pod create" in edit["metadata"]["annotations"]["torchflex.io/security"]
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert "rbac.authorization.k8s.io/aggregate-to-edit" not in view["metadata"]["labels"]
    view_verbs = {v for rule in view["rules"] for v in rule["verbs"]}
    assert view_verbs == {"get", "list", "watch"}
    off = render({"rbac": {"aggregateToDefaultRoles": False}})
    assert [r["metadata"]["name"] for r in find(off, "ClusterRole")] == [
        "tf-torchflex-torchflex-system"
    ]


def test_admission_policy_is_off_by_default_and_renders_the_values() -> None:
    assert not find(render({}), "ValidatingAdmissionPolicy")
    docs = render(
        {
            "admissionPolicy": {
                "enabled": True,
                "allowedServiceAccounts": ["trainer"],
                "allowedHostPathPrefixes": ["/mnt/datasets"],
                "namespaceSelector": {"matchLabels": {"tenant": "yes"}},
                "validationActions": ["Warn", "Audit"],
            }
        }
    )
    policy = one(docs, "ValidatingAdmissionPolicy")
    binding = one(docs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Warn", "Audit"]
    assert binding["spec"]["matchResources"]["namespaceSelector"] == {
        "matchLabels": {"tenant": "yes"}
    }
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert variables["allowedServiceAccounts"] == '["trainer"]'
    assert variables["allowedHostPathPrefixes"] == '["/mnt/datasets"]'
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rules == [
        {
            "apiGroups": ["torchflex.io"],
            "apiVersions": ["*"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["elasticjobs"],
        }
    ]
