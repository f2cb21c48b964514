"""Stragglers the agents named (issue 28): status, Events, the Replace policy, avoided nodes.

Driven through ``planner.plan`` with node rank 0's live report, plus the pure
``stragglers`` rules and the rendered pod's node affinity.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from tests.unit.operator.factories import (
    NAME,
    NOW,
    ago,
    job,
    job_obj,
    observed,
    parsed,
    worker,
    written,
)
from torchflex_contract import labels
from torchflex_contract.progress import AgentReport, AgentState, StragglerReport
from torchflex_operator.model.errors import InvalidSpecError
from torchflex_operator.model.plan import Plan
from torchflex_operator.model.settings import Settings
from torchflex_operator.model.spec import JobSpec, StragglerPolicy
from torchflex_operator.model.vocabulary import EventReason
from torchflex_operator.planning import plan
from torchflex_operator.planning.rules import stragglers
from torchflex_operator.render.builders import worker_pod

RUNNING: dict[str, Any] = {"phase": "Running", "startTime": ago(60), "desiredReplicas": 3}


def wn(i: int) -> str:
    return labels.worker_pod_name(NAME, i)


def leader(*slow: int, round_no: int = 2) -> dict[str, AgentReport]:
    named = tuple(
        StragglerReport(node_rank=i, pod=wn(i), forward_s=0.03, ratio=3.1, round=round_no)
        for i in slow
    )
    report = AgentReport(AgentState.RUNNING, round=round_no, node_rank=0, stragglers=named)
    return {wn(0): report}


def pods() -> list[Any]:
    return [
        worker(i, node_name=f"node-{i}", created=NOW - dt.timedelta(seconds=120)) for i in range(3)
    ]


def events(result: Plan, reason: EventReason) -> list[str]:
    return [e.message for e in result.events if e.reason == reason]


def test_a_straggler_is_named_in_status_with_one_event_and_left_alone_by_default() -> None:
    result = plan(job(maxReplicas=3), parsed(RUNNING), observed(*pods(), reports=leader(1)), NOW)
    status = written(result)
    [entry] = status["stragglers"]
    assert entry["pod"] == wn(1) and entry["node"] == "node-1" and entry["ratio"] == 3.1
    assert entry["nodeRank"] == 1 and entry["forwardSeconds"] == 0.03
    [message] = events(result, EventReason.STRAGGLER_DETECTED)
    assert wn(1) in message and "node-1" in message and "3.1x" in message
    assert not result.delete_pods and "avoidedNodes" not in status
    assert result.status is not None
    again = plan(job(maxReplicas=3), result.status, observed(*pods(), reports=leader(1)), NOW)
    assert events(again, EventReason.STRAGGLER_DETECTED) == []
    assert written(again)["stragglers"][0]["since"] == entry["since"]


def test_replace_deletes_the_straggler_and_keeps_new_pods_off_its_node() -> None:
    spec = job(minReplicas=2, maxReplicas=3, stragglerPolicy="Replace")
    result = plan(spec, parsed(RUNNING), observed(*pods(), reports=leader(1)), NOW)
    assert [d.name for d in result.delete_pods] == [wn(1)]
    assert not result.delete_pods[0].force
    status = written(result)
    assert status["avoidedNodes"] == ["node-1"]
    [message] = events(result, EventReason.STRAGGLER_REPLACED)
    assert wn(1) in message and "node-1" in message


def test_replace_never_takes_the_job_below_its_minimum() -> None:
    spec = job(minReplicas=3, maxReplicas=3, stragglerPolicy="Replace")
    result = plan(spec, parsed(RUNNING), observed(*pods(), reports=leader(1)), NOW)
    assert not result.delete_pods
    [message] = events(result, EventReason.STRAGGLER_REPLACED)
    assert "kept" in message and "minReplicas" in message


def test_a_replacement_under_the_same_name_is_not_judged_by_the_old_report() -> None:
    spec = job(minReplicas=2, maxReplicas=3, stragglerPolicy="Replace")
    first = plan(spec, parsed(RUNNING), observed(*pods(), reports=leader(1)), NOW)
    assert first.status is not None
    assert written(first)["stragglers"][0]["replaced"] is True
    later = NOW + dt.timedelta(seconds=1)
    fresh = [*pods()[:1], worker(1, node_name="node-9", created=later), pods()[2]]
    again = plan(spec, first.status, observed(*fresh, reports=leader(1)), NOW)
    assert not again.delete_pods
    assert events(again, EventReason.STRAGGLER_DETECTED) == []
    assert [e["pod"] for e in written(again)["stragglers"]] == [wn(1)]
    # Once the group re-formed (a newer round names nobody) the entry goes.
    quiet = {wn(0): AgentReport(AgentState.RUNNING, round=3, node_rank=0)}
    assert again.status is not None
    done = plan(spec, again.status, observed(*fresh, reports=quiet), NOW)
    assert "stragglers" not in written(done)


def pool(name: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": "pool", "operator": "In", "values": [name]}]}


REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def test_new_pods_are_rendered_off_the_avoided_nodes_within_the_templates_own_terms() -> None:
    affinity = {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [pool("a"), pool("b")]}}}
    trainer = {"name": "trainer", "image": "i", "command": ["python", "t.py"]}
    spec = JobSpec.parse(
        job_obj(template={"spec": {"affinity": affinity, "containers": [trainer]}})
    )
    pod = worker_pod(spec, 0, Settings(), avoid=("node-2", "node-1"))
    terms = pod["spec"]["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]
    keep_off = {"key": "metadata.name", "operator": "NotIn", "values": ["node-1", "node-2"]}
    assert [t["matchFields"] for t in terms] == [[keep_off], [keep_off]]
    assert terms[0]["matchExpressions"] == pool("a")["matchExpressions"]
    plain = worker_pod(spec, 0, Settings())
    assert plain["spec"]["affinity"] == affinity


def test_avoided_nodes_are_bounded_and_unique() -> None:
    nodes: tuple[str, ...] = ()
    for i in range(20):
        nodes = stragglers.avoid(nodes, f"n{i}")
    nodes = stragglers.avoid(nodes, "n10")
    assert len(nodes) == stragglers.AVOIDED_KEPT and nodes[-1] == "n10" and nodes.count("n10") == 1


def test_only_the_newest_rounds_stragglers_count() -> None:
    reports = {**leader(1, round_no=2), wn(2): leader(2, round_no=3)[wn(0)]}
    found = stragglers.current(stragglers.newest(reports), pods(), None)
    assert [pod.name for pod, _ in found] == [wn(2)]


@pytest.mark.parametrize(("value", "policy"), [(None, "Ignore"), ("Replace", "Replace")])
def test_policy_parses(value: str | None, policy: str) -> None:
    spec = job() if value is None else job(stragglerPolicy=value)
    assert spec.straggler_policy is StragglerPolicy(policy)


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(InvalidSpecError, match="Evict"):
        JobSpec.parse(job_obj(stragglerPolicy="Evict"))


def test_a_pod_whose_node_failed_its_check_is_replaced_uncounted_and_its_node_avoided() -> None:
    bad = worker(2, "Failed", exit_code=79, node_name="node-2", uid="uid-bad")
    spec = job(minReplicas=2, maxReplicas=3, nodeCheck={"enabled": True})
    result = plan(spec, parsed(RUNNING), observed(*pods()[:2], bad), NOW)
    status = written(result)
    assert status["lastFailure"]["reason"] == "BadNode" and not status["lastFailure"]["counted"]
    assert status["avoidedNodes"] == ["node-2"]
    assert status.get("failures") in (None, 0)
    assert [d.name for d in result.delete_pods] == [wn(2)]


def test_node_check_reaches_the_agent_only_when_enabled() -> None:
    from torchflex_contract import env
    from torchflex_operator.render.builders import contract_env

    on = {e["name"]: e.get("value") for e in contract_env(job(nodeCheck={"enabled": True}), 0, {})}
    off = {e["name"]: e.get("value") for e in contract_env(job(), 0, {})}
    assert on[env.NODE_CHECK] == "on" and env.NODE_CHECK not in off
