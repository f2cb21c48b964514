"""The chart's RBAC is exactly what the code uses: derived here from the source.

What the operator calls is read from its code, not from a list kept by hand:
- the ``kube`` package (the only place calling the API): every ``self.core.X`` /
  ``self.custom.X`` / ``self.networking.X`` / ``self.coordination.X`` /
  ``self.scheduling.X`` / ``self.kueue.X`` call (API discovery aside: every client may
  read it), mapped from the client's method name to a verb and resource (``create_namespaced_pod``
  → pods create); the Lease calls (leader election) go to a Role in the release
  namespace, get/update limited to the Lease's name;
- ``handlers.py``: every ``kopf.on.event(group, version, plural)`` is a kopf
  watch (list + watch);
- ``manifests.py`` (every owned object): owner references with ``blockOwnerDeletion`` need
  ``update`` on ``elasticjobs/finalizers`` where OwnerReferencesPermissionEnforcement
  is on;
- kopf itself (its observers in ``kopf._core.reactor.observation``; it runs
  standalone, so no peering objects): CRDs list/watch, namespaces list/watch
  when not cluster-wide.

Then the rendered Roles/ClusterRoles must equal that set, in both modes: no
missing verb (a 403 in a real cluster) and no extra one (not least privilege).
The integration test proves the same on a real API server (no 403 in the log).
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
from kopf._cogs.structs import references

from tests.unit.install.chart import NAMESPACE, VALUE_SETS, find, one, render, rules_of
from torchflex_contract import labels
from torchflex_operator import kube
from torchflex_operator.model.settings import Settings
from torchflex_operator.model.spec import JobSpec
from torchflex_operator.render import backends, builders
from torchflex_operator.render import workload as queueing
from torchflex_operator.runtime import handlers

Rule = tuple[str, str, str]
# The operator's own ClusterRole; the chart's user-facing ones (aggregated into
# edit/view, templates/tenancy.yaml) grant users, not the operator.
OPERATOR_CLUSTER_ROLE = "tf-torchflex-torchflex-system"
CLUSTER_SCOPED = {"nodes", "namespaces", "customresourcedefinitions", "workloadpriorityclasses"}
LEASE_ROLE = "tf-torchflex-leader-election"
LEASES = ("coordination.k8s.io", "leases")
_VERBS = {"create": "create", "delete": "delete", "list": "list", "get": "get", "read": "get",
          "patch": "patch", "replace": "update"}  # fmt: skip
_CORE_PLURALS = {"pod": "pods", "service": "services", "event": "events", "node": "nodes"}
_NETWORKING_PLURALS = {"network_policy": "networkpolicies"}
_SCHEDULING_PLURALS = {"pod_group": "podgroups"}
_POLICY_PLURALS = {"pod_disruption_budget": "poddisruptionbudgets"}
# API discovery (``get_api_resources``) is granted to every authenticated client.
_DISCOVERY = "get_api_resources"
_METHOD = re.compile(r"^(?P<verb>[a-z]+)_namespaced_(?P<kind>[a-z_]+?)(?P<status>_status)?$")


def _client_calls() -> list[tuple[str, str]]:
    """(api, method) of every ``self.core.m(...)`` / ``self.custom.m(...)`` in the kube package
    (``self.scheduling`` too: the PodGroups; ``self.policy``: the PodDisruptionBudgets),
    discovery left out."""
    sources = sorted(Path(inspect.getfile(kube)).parent.glob("*.py"))
    assert len(sources) > 1, "the kube package's modules were not found"
    calls = []
    for node in (n for src in sources for n in ast.walk(ast.parse(src.read_text()))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Attribute)
            and isinstance(node.func.value.value, ast.Name)
            and node.func.value.value.id == "self"
            and node.func.value.attr
            in ("core", "custom", "networking", "coordination", "scheduling", "kueue", "policy")
            and node.func.attr != _DISCOVERY
        ):
            calls.append((node.func.value.attr, node.func.attr))
    return calls


def kube_rules() -> set[Rule]:
    out: set[Rule] = set()
    for api, method in _client_calls():
        if (api, method) == ("kueue", "get_cluster_custom_object"):
            out.add((queueing.GROUP, queueing.PRIORITY_CLASSES, "get"))
            continue
        m = _METHOD.match(method)
        assert m, f"kube calls {api}.{method}: teach this test its verb/resource"
        verb = _VERBS[m["verb"]]
        if api == "custom":
            assert m["kind"] == "custom_object", method
            group, resource = labels.GROUP, labels.PLURAL
        elif api == "kueue":
            assert m["kind"] == "custom_object", method
            group, resource = queueing.GROUP, queueing.PLURAL
        elif api == "networking":
            group, resource = "networking.k8s.io", _NETWORKING_PLURALS[m["kind"]]
        elif api == "scheduling":
            group, resource = "scheduling.k8s.io", _SCHEDULING_PLURALS[m["kind"]]
        elif api == "policy":
            group, resource = "policy", _POLICY_PLURALS[m["kind"]]
        elif api == "coordination":
            assert m["kind"] == "lease", method
            group, resource = LEASES
        else:
            group, resource = "", _CORE_PLURALS[m["kind"]]
        out.add((group, resource + ("/status" if m["status"] else ""), verb))
    return out


def _resolve(node: ast.expr) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        assert node.value.id == "labels", ast.dump(node)
        return str(getattr(labels, node.attr))
    raise AssertionError(f"cannot resolve {ast.dump(node)}")


def watched_resources() -> set[tuple[str, str]]:
    """(group, plural) of every kopf.on.event handler in handlers.py."""
    tree = ast.parse(Path(inspect.getfile(handlers)).read_text())
    out: set[tuple[str, str]] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "event"
            and ast.unparse(node.func.value) == "kopf.on"
        ):
            group, _version, plural = (_resolve(a) for a in node.args)
            out.add((group, plural))
    assert out, "no kopf.on.event handlers found"
    return out


def owner_rules() -> set[Rule]:
    obj = {
        "apiVersion": labels.API_VERSION,
        "kind": labels.KIND,
        "metadata": {"name": "j", "namespace": "ns", "uid": "u", "generation": 1},
        "spec": {
            "minReplicas": 1,
            "maxReplicas": 1,
            "template": {
                "spec": {"containers": [{"name": "trainer", "image": "i", "command": ["x"]}]}
            },
        },
    }
    job = JobSpec.parse(obj)
    owned = [builders.worker_pod(job, 0, Settings()), backends.store_pod(job, Settings())]
    owned += builders.services(job)
    refs = [r for o in owned for r in o["metadata"]["ownerReferences"]]
    assert refs
    if any(r.get("blockOwnerDeletion") for r in refs):
        return {(labels.GROUP, f"{labels.PLURAL}/finalizers", "update")}
    return set()


def kopf_rules(*, clusterwide: bool) -> set[Rule]:
    crds = references.CRDS
    out: set[Rule] = {(crds.group or "", str(crds.any_name), v) for v in ("list", "watch")}
    if not clusterwide:
        ns = references.NAMESPACES
        out |= {(ns.group or "", str(ns.any_name), v) for v in ("list", "watch")}
    return out


def lease_rules() -> set[Rule]:
    """The leader-election Lease calls of the kube package (the Role in the release namespace)."""
    return {r for r in kube_rules() if r[:2] == LEASES}


def required(*, clusterwide: bool, watch_nodes: bool = True) -> set[Rule]:
    """What the operator's (Cluster)Roles for the jobs must grant: all but the Lease."""
    rules = kube_rules() - lease_rules() | owner_rules() | kopf_rules(clusterwide=clusterwide)
    for group, plural in watched_resources():
        if plural == "nodes" and not watch_nodes:
            continue
        rules |= {(group, plural, "list"), (group, plural, "watch")}
    return rules


def _split(rules: set[Rule]) -> tuple[set[Rule], set[Rule]]:
    cluster = {r for r in rules if r[1] in CLUSTER_SCOPED}
    return rules - cluster, cluster


def test_derivation_sees_the_calls_we_know_about() -> None:
    # Guards the derivation itself: if the kube package changes, this moves with it.
    rules = kube_rules()
    assert ("", "pods", "create") in rules
    assert (labels.GROUP, f"{labels.PLURAL}/status", "patch") in rules
    assert ("", "nodes") in watched_resources()
    assert lease_rules() == {(*LEASES, v) for v in ("get", "create", "update")}
    assert ("scheduling.k8s.io", "podgroups", "patch") in rules
    assert ("kueue.x-k8s.io", "workloads/status", "patch") in rules
    assert ("kueue.x-k8s.io", "workloadpriorityclasses", "get") in rules
    assert ("kueue.x-k8s.io", "workloads") in watched_resources()


def assert_lease_role(docs: list[dict[str, Any]], election: bool) -> None:
    """With leader election, exactly the Lease calls, in the release namespace, and all
    but create (which RBAC cannot limit by name) limited to the Lease's own name."""
    if not election:
        assert not find(docs, "Role", LEASE_ROLE)
        return
    role = one(docs, "Role", LEASE_ROLE)
    assert role["metadata"]["namespace"] == NAMESPACE
    assert rules_of(role) == lease_rules()
    for rule in role["rules"]:
        assert rule["verbs"] == ["create"] or rule["resourceNames"] == ["tf-torchflex"]


@pytest.mark.parametrize(
    ("name", "election", "watch_nodes"),
    [("default", False, True), ("ha", True, True), ("minimal", False, False)],
)
def test_cluster_mode_clusterrole_is_exactly_what_the_code_uses(
    name: str, election: bool, watch_nodes: bool
) -> None:
    docs = render(VALUE_SETS[name])
    assert [r["metadata"]["name"] for r in find(docs, "Role")] == ([LEASE_ROLE] if election else [])
    granted = rules_of(one(docs, "ClusterRole", OPERATOR_CLUSTER_ROLE))
    assert granted == required(clusterwide=True, watch_nodes=watch_nodes)
    assert_lease_role(docs, election)


@pytest.mark.parametrize(("name", "election"), [("namespaced", False), ("namespaced-ha", True)])
def test_namespaced_mode_roles_and_clusterrole_are_exactly_what_the_code_uses(
    name: str, election: bool
) -> None:
    values = VALUE_SETS[name]
    docs = render(values)
    assert_lease_role(docs, election)
    namespaced, cluster = _split(required(clusterwide=False))
    roles = [r for r in find(docs, "Role") if r["metadata"]["name"] != LEASE_ROLE]
    assert sorted(r["metadata"]["namespace"] for r in roles) == values["watch"]["namespaces"]
    for role in roles:
        assert rules_of(role) == namespaced
    assert rules_of(one(docs, "ClusterRole", OPERATOR_CLUSTER_ROLE)) == cluster
    # Nothing namespaced is granted cluster-wide in this mode.
    assert all(r[1] in CLUSTER_SCOPED for r in cluster)


def test_operator_bindings_name_the_operator_service_account() -> None:
    for name in ("default", "namespaced"):
        docs = render(VALUE_SETS[name])
        sa = [s for s in find(docs, "ServiceAccount") if s["metadata"]["name"] == "tf-torchflex"]
        assert len(sa) == 1
        for binding in find(docs, "ClusterRoleBinding") + find(docs, "RoleBinding"):
            assert binding["subjects"] == [
                {
                    "kind": "ServiceAccount",
                    "name": "tf-torchflex",
                    "namespace": sa[0]["metadata"]["namespace"],
                }
            ]
