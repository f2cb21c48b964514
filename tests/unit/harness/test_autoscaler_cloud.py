"""The autoscaler test cloud's bookkeeping (e2e/autoscaler/groups.py) and hook answers.

Tables of what the cloud answers cluster-autoscaler's externalgrpc calls (in
the proto's JSON field names) and which nodes it starts or stops; node
processes are not started here (``TestCloud`` is given a stand-in for its
node actions). The real autoscaler against it: tests/e2e/test_autoscaler.py.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest

from e2e.autoscaler.cloud import TestCloud, template_node
from e2e.autoscaler.groups import GROUP_LABEL, CloudError, Groups, GroupSpec, Instance
from e2e.cluster.layout import PROCESS_NODE_LABEL
from e2e.kubelet.nodes import CAPACITY


def _groups() -> Groups:
    return Groups.of(GroupSpec("spot", 0, 2, spot=True), GroupSpec("ondemand", 1, 3))


@pytest.mark.parametrize(
    ("group", "deltas", "sizes", "error"),
    [
        ("spot", [1, 1], [1, 2], None),
        ("spot", [2], [2], None),
        ("spot", [1, 2], [1], "size 1 \\+ 2 > 2"),
        ("spot", [0], [], "size 0 \\+ 0"),
        ("gpu", [1], [], "no node group 'gpu'"),
        ("ondemand", [3], [3], None),
    ],
)
def test_increase_stays_within_the_group_maximum(
    group: str, deltas: list[int], sizes: list[int], error: str | None
) -> None:
    groups = _groups()
    seen = []
    for delta in deltas:
        try:
            groups.increase(group, delta)
        except CloudError as exc:
            assert error is not None and re.search(error, str(exc)), exc
            break
        seen.append(groups.target(group))
    else:
        assert error is None
    assert seen == sizes


def test_instances_get_distinct_addresses_and_numbers_are_reused() -> None:
    groups = _groups()
    a, b = groups.increase("spot", 2)
    c = groups.increase("ondemand", 1)[0]
    assert len({a.host, b.host, c.host}) == 3
    blocks = sorted(i.first_pod_ip for i in (a, b, c))
    assert all(hi - lo >= 1000 for lo, hi in itertools.pairwise(blocks))
    assert a.provider_id == f"torchflex-test://{a.name}"
    groups.remove(a.name)
    (d,) = groups.increase("spot", 1)
    assert d.number == a.number  # the freed number (and address block) again


@pytest.mark.parametrize(
    ("node", "group"),
    [
        ({"name": "tf-spot-1", "providerID": "torchflex-test://tf-spot-1"}, "spot"),
        ({"name": "tf-node-0", "providerID": ""}, None),  # the cluster's own node: not ours
        ({"name": "x", "providerID": "torchflex-test://tf-spot-9"}, None),
    ],
)
def test_group_of_a_node_by_provider_id(node: dict[str, str], group: str | None) -> None:
    groups = _groups()
    groups.increase("spot", 1)
    assert groups.group_of(node) == group


@pytest.mark.parametrize(
    ("registered", "delta", "removed", "error"),
    [
        (set(), -2, ["tf-spot-2", "tf-spot-1"], False),
        ({"tf-spot-1"}, -1, ["tf-spot-2"], False),
        ({"tf-spot-1"}, -2, [], True),  # would touch a registered node
        (set(), 1, [], True),  # a decrease only
    ],
)
def test_decrease_touches_only_nodes_that_never_registered(
    registered: set[str], delta: int, removed: list[str], error: bool
) -> None:
    groups = _groups()
    groups.increase("spot", 2)
    if error:
        with pytest.raises(CloudError):
            groups.not_registered("spot", delta, registered)
    else:
        got = groups.not_registered("spot", delta, registered)
        assert [i.name for i in got] == removed


def test_delete_nodes_names_only_instances_of_the_group() -> None:
    groups = _groups()
    (spot,) = groups.increase("spot", 1)
    (ondemand,) = groups.increase("ondemand", 1)
    assert groups.by_provider_ids("spot", [{"providerID": spot.provider_id}]) == [spot]
    with pytest.raises(CloudError):
        groups.by_provider_ids("spot", [{"providerID": ondemand.provider_id}])


class _Cloud(TestCloud):
    """The hook's answers, with node actions recorded instead of run."""

    def __init__(self) -> None:  # no cluster: nothing is started
        import threading

        self.groups = _groups()
        self.lock = threading.Lock()
        self.timeline = []
        self.actions: list[tuple[str, str]] = []
        self.present: set[str] = set()

    def _start_node(self, inst: Instance) -> None:
        self.actions.append(("start", inst.name))

    def _stop_node(self, inst: Instance) -> None:
        self.actions.append(("stop", inst.name))

    def registered(self) -> set[str]:
        return self.present


def test_hook_answers_each_call_and_acts_on_sizes() -> None:
    cloud = _Cloud()
    ans = cloud.answer
    groups = ans("NodeGroups", {})["nodeGroups"]
    assert groups == [
        {"id": "spot", "minSize": 0, "maxSize": 2},
        {"id": "ondemand", "minSize": 1, "maxSize": 3},
    ]
    assert ans("NodeGroupIncreaseSize", {"id": "spot", "delta": 2}) == {}
    assert cloud.actions == [("start", "tf-spot-1"), ("start", "tf-spot-2")]
    assert ans("NodeGroupTargetSize", {"id": "spot"}) == {"targetSize": 2}
    pid = "torchflex-test://tf-spot-1"
    node = {"name": "tf-spot-1", "providerID": pid}
    assert ans("NodeGroupForNode", {"node": node})["nodeGroup"]["id"] == "spot"
    assert ans("NodeGroupForNode", {"node": {"name": "tf-node-0"}}) == {"nodeGroup": {"id": ""}}
    instances = ans("NodeGroupNodes", {"id": "spot"})["instances"]
    assert [i["id"] for i in instances] == [pid, "torchflex-test://tf-spot-2"]
    assert ans("NodeGroupDeleteNodes", {"id": "spot", "nodes": [node]}) == {}
    assert cloud.actions[-1] == ("stop", "tf-spot-1")
    cloud.present = set()
    assert ans("NodeGroupDecreaseTargetSize", {"id": "spot", "delta": -1}) == {}
    assert ans("NodeGroupTargetSize", {"id": "spot"}) == {"targetSize": 0}
    assert [k for _, k, _ in cloud.timeline] == ["requested", "requested", "deleted"]
    for method in ("GetAvailableGPUTypes", "Cleanup", "Refresh"):
        assert ans(method, {}) == {}
    with pytest.raises(KeyError):
        ans("PricingNodePrice", {})


def test_template_node_is_a_ready_process_node_of_the_group() -> None:
    node: dict[str, Any] = template_node("spot")
    assert node["metadata"]["labels"][GROUP_LABEL] == "spot"
    assert node["metadata"]["labels"][PROCESS_NODE_LABEL] == "process"
    assert node["status"]["allocatable"] == CAPACITY
    assert {"type": "Ready", "status": "True"} in node["status"]["conditions"]
