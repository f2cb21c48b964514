"""Table tests of warm spares (``spec.warmSpares``) in the pure plan, and the
one API call that promotes a spare (``Kube.set_pod_metadata``), and the
PodDisruptionBudget that leaves spares out."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
from typing import Any

import pytest
from kubernetes.client import ApiClient

from tests.unit.operator.factories import (
    NAME,
    NOW,
    NS,
    ClientStandIn,
    ago,
    api_error,
    decided,
    job,
    job_obj,
    observed,
    parsed,
    raising,
    worker,
    written,
)
from torchflex_contract import env, labels
from torchflex_contract.labels import Annotation
from torchflex_contract.labels import PodKind as Role
from torchflex_contract.progress import AgentReport, AgentState
from torchflex_operator.kube import Kube
from torchflex_operator.model.errors import InvalidSpecError
from torchflex_operator.model.kueue import Admission, Gate
from torchflex_operator.model.observed import PodView
from torchflex_operator.model.plan import Plan, PodPromote
from torchflex_operator.model.settings import Settings
from torchflex_operator.model.spec import JobSpec
from torchflex_operator.model.status import JobStatus
from torchflex_operator.model.vocabulary import ConditionType, EventReason, Phase
from torchflex_operator.planning import plan
from torchflex_operator.render import builders
from torchflex_operator.render import pdb as disruption
from torchflex_operator.runtime.expectations import TIMEOUT as EXPECTATION_TIMEOUT
from torchflex_operator.runtime.expectations import Expectations

SPARE_PATH = f"{env.STANDBY_MOUNT_DIR}/{env.STANDBY_FILE_NAME}"


def running(desired: int) -> dict[str, Any]:
    return {"phase": "Running", "startTime": ago(10), "desiredReplicas": desired}


def spare(index: int, phase: str = "Running", **kw: Any) -> PodView:
    return worker(index, phase, standby=True, **kw)


def wn(i: int) -> str:
    return labels.worker_pod_name(NAME, i)


def spec(replicas: int, warm: int = 1) -> JobSpec:
    return job(minReplicas=2, maxReplicas=4, replicas=replicas, warmSpares=warm)


def run(spec_: JobSpec, status: dict[str, Any], *pods: PodView, **kw: Any) -> Plan:
    return plan(spec_, parsed(status), observed(*pods, **kw), NOW)


def worker_creates(result: Plan) -> dict[int, dict[str, Any]]:
    return {
        int(m["metadata"]["labels"][labels.Label.REPLICA_INDEX]): m
        for m in result.create_pods
        if m["metadata"]["labels"][labels.Label.ROLE] == Role.WORKER
    }


def deleted(result: Plan) -> list[str]:
    return sorted(d.name for d in result.delete_pods)


def trainer(manifest: dict[str, Any]) -> dict[str, Any]:
    (container,) = manifest["spec"]["containers"]
    return dict(container)


def is_spare_manifest(manifest: dict[str, Any]) -> bool:
    """Annotation, downward-API volume, its mount and the env var: all or none."""
    annotated = bool(
        manifest["metadata"]["annotations"].get(Annotation.STANDBY) == env.STANDBY_TRUE
    )
    volumes = [v for v in manifest["spec"].get("volumes") or [] if v["name"] == env.STANDBY_VOLUME]
    container = trainer(manifest)
    mounts = [m for m in container.get("volumeMounts") or [] if m["name"] == env.STANDBY_VOLUME]
    envs = [e for e in container["env"] if e["name"] == env.STANDBY_FILE]
    parts = [annotated, bool(volumes), bool(mounts), bool(envs)]
    assert all(parts) or not any(parts), parts
    if annotated:
        (item,) = volumes[0]["downwardAPI"]["items"]
        assert item == {
            "path": env.STANDBY_FILE_NAME,
            "fieldRef": {"fieldPath": "metadata.annotations['torchflex.io/standby']"},
        }
        assert mounts[0]["mountPath"] == env.STANDBY_MOUNT_DIR
        assert envs == [{"name": env.STANDBY_FILE, "value": SPARE_PATH}]
    return annotated


def as_observed(manifest: dict[str, Any], uid: str) -> PodView:
    """A created manifest as the next pass sees it: running on a node."""
    pod = {
        **manifest,
        "metadata": {**manifest["metadata"], "uid": uid},
        "spec": {**manifest["spec"], "nodeName": "node-a"},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    return PodView.from_pod(pod)


# --- the spec and the manifests ---------------------------------------------------


def test_warm_spares_parse_default_zero_and_refuse_negative() -> None:
    assert job().warm_spares == 0
    assert spec(2, 3).warm_spares == 3
    with pytest.raises(InvalidSpecError, match="warmSpares"):
        spec(2, -1)


def test_members_carry_nothing_of_a_spare_and_keep_their_hash() -> None:
    # Turning warmSpares on must not roll a single member.
    assert builders.template_hash(spec(2, 0)) == builders.template_hash(spec(2, 2))
    member = builders.worker_pod(spec(2), 0, Settings())
    assert not is_spare_manifest(member)
    made = builders.worker_pod(spec(2), 2, Settings(), spare=True)
    assert is_spare_manifest(made)
    hashes = {m["metadata"]["annotations"][Annotation.SPEC_HASH] for m in (member, made)}
    assert hashes == {builders.template_hash(spec(2))}
    assert PodView.from_pod(made).standby and not PodView.from_pod(member).standby
    assert made["metadata"]["labels"][labels.Label.STANDBY] == env.STANDBY_TRUE
    assert labels.Label.STANDBY not in member["metadata"]["labels"]


# --- creating, promoting, deleting --------------------------------------------------


@pytest.mark.parametrize(
    ("replicas", "warm", "pods", "created", "gone"),
    [
        pytest.param(2, 1, [worker(0), worker(1)], {2: True}, [], id="one-spare-beside-members"),
        pytest.param(
            2, 2, [worker(0), worker(1)], {2: True, 3: True}, [], id="two-spares-fill-the-room"
        ),
        pytest.param(2, 0, [worker(0), worker(1)], {}, [], id="off-by-default"),
        pytest.param(
            2, 1, [worker(0)], {1: False}, [], id="members-first-no-spare-while-one-is-missing"
        ),
        pytest.param(4, 2, [worker(i) for i in range(4)], {}, [], id="capped-at-max-replicas"),
        pytest.param(
            3, 2, [worker(i) for i in range(3)], {3: True}, [], id="capped-at-room-to-grow"
        ),
        pytest.param(
            2,
            1,
            [worker(0), worker(1), spare(3)],
            {2: True},
            [wn(3)],
            id="a-spare-beyond-the-range-is-replaced-in-range",
        ),
        pytest.param(
            2,
            1,
            [worker(0), worker(1), spare(2, spec_hash="old")],
            {},
            [wn(2)],
            id="an-out-of-date-spare-is-deleted",
        ),
    ],
)
def test_spares_created_in_the_range_after_the_members(
    replicas: int, warm: int, pods: list[PodView], created: dict[int, bool], gone: list[str]
) -> None:
    result = run(spec(replicas, warm), running(replicas), *pods)
    made = worker_creates(result)
    assert {i: is_spare_manifest(m) for i, m in made.items()} == created
    assert deleted(result) == gone
    assert not result.promote_pods


@pytest.mark.parametrize(("admitted", "created"), [(4, [2, 3]), (3, [2]), (2, [])])
def test_a_queued_job_keeps_spares_only_within_what_kueue_admitted(
    admitted: int, created: list[int]
) -> None:
    gate = Gate(Admission.ADMITTED, "wl", "q", count=admitted)
    result = run(spec(2, 2), running(2), worker(0), worker(1), queue=gate)
    assert sorted(worker_creates(result)) == created


def test_scale_up_promotes_the_spare_and_makes_the_next_one() -> None:
    result = run(spec(3), running(2), worker(0), worker(1), spare(2))
    assert result.promote_pods == [PodPromote(wn(2), "uid-2")]
    promoted = [e for e in result.events if e.reason is EventReason.SPARE_PROMOTED]
    assert [e.message for e in promoted] == [f"promoted warm spare {wn(2)} to a member"]
    made = worker_creates(result)
    assert list(made) == [3] and is_spare_manifest(made[3])  # no new pod at index 2
    status = written(result)
    assert (status["replicas"], status["desiredReplicas"], status["warmSpares"]) == (3, 3, 0)
    assert not result.delete_pods


def test_scale_up_to_max_promotes_and_makes_no_spare() -> None:
    pods = (worker(0), worker(1), worker(2), spare(3))
    result = run(spec(4), running(3), *pods)
    assert result.promote_pods == [PodPromote(wn(3), "uid-3")]
    assert not worker_creates(result) and not result.delete_pods


def test_scale_down_deletes_the_promoted_pod_in_the_spare_range() -> None:
    # Pod 2 was promoted (annotation "false"): a member, never demoted in place.
    pods = (worker(0), worker(1, "Pending", node_name=None), worker(2), spare(3))
    result = run(spec(2), running(3), *pods)
    assert deleted(result) == [wn(2), wn(3)]  # pod 1 pending stays: it is in the members' range
    assert not worker_creates(result)  # index 2 is recreated as a spare once pod 2 is gone
    assert not result.promote_pods


# --- spares are never members ----------------------------------------------------------


def test_spares_are_not_counted_as_replicas_or_availability() -> None:
    pods = (worker(0), worker(1, "Pending", node_name=None, ready=False), spare(2), spare(3))
    result = run(spec(2, 2), running(2), *pods)
    status = written(result)
    assert (status["replicas"], status["readyReplicas"], status["warmSpares"]) == (2, 1, 2)
    available = decided(result).conditions or ()
    (cond,) = [c for c in available if c.type == ConditionType.MIN_AVAILABLE.value]
    assert cond.status == "False"  # 1 of minimum 2 members: spares do not make up for it


def test_a_silent_spare_is_neither_training_nor_stuck_nor_fenced() -> None:
    member = AgentReport(AgentState.RUNNING, round=3, world_size=2)
    reports = {wn(0): member, wn(1): member}
    pods = (worker(0), worker(1), spare(2))
    result = run(spec(2), running(2), *pods, reports=reports, unanswered=frozenset({wn(2)}))
    status = written(result)
    training = [c for c in status["conditions"] if c["type"] == ConditionType.TRAINING.value]
    assert training[0]["status"] == "True"
    assert status["worldSize"] == 2
    assert not result.delete_pods


def test_members_succeeding_finish_the_job_and_the_spare_goes() -> None:
    done = [worker(0, "Succeeded", exit_code=0), worker(1, "Succeeded", exit_code=0)]
    result = run(JobSpec.parse(_no_clean(2)), running(2), *done, spare(2))
    assert decided(result).phase is Phase.SUCCEEDED
    assert deleted(result) == [wn(2)]  # cleanPodPolicy None keeps the members' pods


@pytest.mark.parametrize(
    "status",
    [
        pytest.param({"phase": "Succeeded", "completionTime": ago(1)}, id="succeeded"),
        pytest.param({"phase": "Failed", "completionTime": ago(1)}, id="failed"),
    ],
)
def test_a_finished_job_keeps_no_spare_whatever_clean_pod_policy(status: dict[str, Any]) -> None:
    result = run(JobSpec.parse(_no_clean(2)), status, worker(0, "Succeeded"), spare(2))
    assert deleted(result) == [wn(2)] and not worker_creates(result)


def test_a_suspended_job_keeps_no_spare() -> None:
    suspended = JobSpec.parse({**_no_clean(2), "spec": {**_no_clean(2)["spec"], "suspend": True}})
    result = run(suspended, running(2), worker(0), worker(1), spare(2))
    assert {wn(0), wn(1), wn(2)} <= set(deleted(result)) and not worker_creates(result)


def test_a_failed_spare_is_replaced_uncounted_after_the_backoff() -> None:
    failed = spare(2, "Failed", exit_code=1, uid="uid-s")
    result = run(spec(2), running(2), worker(0), worker(1), failed)
    assert deleted(result) == [wn(2)]
    status = decided(result)
    assert (status.failures, status.replacement_streak) == (0, 1)
    assert status.backoff_until is not None and status.backoff_until > NOW
    assert EventReason.REPLACED_POD in [e.reason for e in result.events]
    # Next pass: the pod is gone, the backoff still runs: no spare yet, a wake-up instead.
    later = plan(spec(2), status, observed(worker(0), worker(1)), NOW)
    assert not worker_creates(later)
    assert later.requeue_after is not None and later.requeue_after <= 1.0
    assert (decided(later).failures, decided(later).replacement_streak) == (0, 1)


def test_a_spare_deleted_on_purpose_ending_with_an_error_is_no_failure() -> None:
    # SIGTERM from our own delete (out of range, scale-down): exit code and all, no fault.
    gone = spare(3, "Failed", exit_code=1, uid="uid-s", deletion=NOW)
    result = run(spec(2), running(2), worker(0), worker(1), gone)
    status = decided(result)
    assert status.backoff_until is None and not status.replacement_streak
    assert EventReason.REPLACED_POD not in [e.reason for e in result.events]
    assert [wn(2)] == [m["metadata"]["name"] for m in worker_creates(result).values()]


# --- idempotence -------------------------------------------------------------------------


def test_a_second_pass_over_the_result_plans_nothing_new() -> None:
    first = run(spec(3), running(2), worker(0), worker(1), spare(2))
    made = worker_creates(first)
    # The patch applied: pod 2 reads "false" now; spare 3 runs.
    promoted = as_observed(builders.worker_pod(spec(3), 2, Settings(), spare=True), "uid-2")
    promoted = dataclasses.replace(promoted, standby=False)
    pods = (worker(0), worker(1), promoted, as_observed(made[3], "uid-3"))
    second = plan(spec(3), decided(first), observed(*pods), NOW)
    assert not second.create_pods and not second.delete_pods and not second.promote_pods
    assert EventReason.SPARE_PROMOTED not in [e.reason for e in second.events]
    assert written(second)["warmSpares"] == 1


def _no_clean(replicas: int) -> dict[str, Any]:
    return job_obj(replicas=replicas, warmSpares=1, cleanPodPolicy="None")


def test_a_pass_before_the_watch_shows_the_patch_sees_the_spare_promoted() -> None:
    exp = Expectations()
    key = (NS, NAME)
    exp.expect_promoted(key, "uid-2", NOW)
    (view,) = exp.overlay(key, [spare(2)], NOW)
    assert not view.standby and exp.pending(key) == 1
    # Planned from that view, the pod is a member: no second patch.
    assert not run(spec(3), running(3), worker(0), worker(1), view).promote_pods
    (seen,) = exp.overlay(key, [worker(2)], NOW)  # the watch caught up
    assert not seen.standby and exp.pending(key) == 0
    exp.expect_promoted(key, "uid-2", NOW)
    later = NOW + EXPECTATION_TIMEOUT + dt.timedelta(seconds=1)
    assert exp.overlay(key, [spare(2)], later)[0].standby  # the patch was lost: try again


# --- Kube: the promotion's patch -------------------------------------------------------------


def _kube(api: ClientStandIn) -> Kube:
    kube = Kube(ApiClient())
    kube.core = api  # type: ignore[assignment]
    return kube


def test_promotion_is_a_merge_patch_of_the_standby_keys_with_a_uid_precondition() -> None:
    api = ClientStandIn(patch_namespaced_pod=lambda *_, **__: {})
    kube = _kube(api)
    standby = {"torchflex.io/standby": "false"}
    assert asyncio.run(
        kube.set_pod_metadata(NS, wn(2), "uid-2", new_labels=standby, new_annotations=standby)
    )
    ((method, args, kwargs),) = api.calls
    assert method == "patch_namespaced_pod"
    body = {"metadata": {"uid": "uid-2", "labels": standby, "annotations": standby}}
    assert args == (wn(2), NS, body)
    assert kwargs["_content_type"] == "application/merge-patch+json"


@pytest.mark.parametrize("code", [404, 409])
def test_promoting_a_gone_or_replaced_pod_is_no_error(code: int) -> None:
    api = ClientStandIn(patch_namespaced_pod=raising(api_error(code)))
    kube = _kube(api)
    assert not asyncio.run(
        kube.set_pod_metadata(NS, wn(2), "u", new_labels={"k": "v"}, new_annotations={})
    )


# --- the PodDisruptionBudget counts members only ----------------------------------------------


def _selects(selector: dict[str, Any], pod: dict[str, Any]) -> bool:
    have = pod["metadata"]["labels"]
    if any(have.get(k) != v for k, v in selector["matchLabels"].items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        assert expr["operator"] == "NotIn"
        if have.get(expr["key"]) in expr["values"]:
            return False
    return True


def test_the_budget_of_a_job_with_spares_selects_members_and_promoted_pods_only() -> None:
    pdb = disruption.pod_disruption_budget(spec(2))
    selector = pdb["spec"]["selector"]
    member = builders.worker_pod(spec(2), 0, Settings())
    made = builders.worker_pod(spec(2), 2, Settings(), spare=True)
    promoted = {**made, "metadata": {**made["metadata"], "labels": {**made["metadata"]["labels"]}}}
    promoted["metadata"]["labels"][labels.Label.STANDBY] = "false"
    assert (_selects(selector, member), _selects(selector, made)) == (True, False)
    assert _selects(selector, promoted)
    # Without spares the budget is what it always was (no expression to patch in).
    assert (
        "matchExpressions" not in disruption.pod_disruption_budget(spec(2, 0))["spec"]["selector"]
    )


@pytest.mark.parametrize(
    ("warm", "written", "spares_written", "needed"),
    [(1, 2, False, True), (1, 2, True, False), (0, 2, True, True), (0, 2, False, False)],
)
def test_the_budget_is_written_again_when_spares_turn_on_or_off(
    warm: int, written: int, spares_written: bool, needed: bool
) -> None:
    assert disruption.needs_write(spec(2, warm), written, spares_written) is needed


def test_turning_spares_on_patches_the_budgets_selector() -> None:
    old = disruption.pod_disruption_budget(spec(2, 0))
    want = disruption.pod_disruption_budget(spec(2, 1))
    patch = disruption.spec_patch(want, old)
    assert patch == {"spec": {"selector": want["spec"]["selector"]}}
    back = disruption.spec_patch(old, want)  # and off again: the expression goes
    assert back == {"spec": {"selector": {"matchExpressions": None, **old["spec"]["selector"]}}}


def test_status_round_trips_warm_spares() -> None:
    assert JobStatus.parse({"warmSpares": 2}).warm_spares == 2
