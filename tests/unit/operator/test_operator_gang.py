"""Gang scheduling of the minimum: the PodGroup builder, the pods' link, and the fallback.

Pure tables for ``gang`` and the pod builder; the fallback is ``Kube``'s own
code against a stand-in for the client's ``SchedulingV1beta1Api`` that answers
the way an API server without the Workload API does (404), so the typed
answers the reconciler falls back on are checked without a cluster. The real
API is exercised in tests/integration/operator/test_operator_gang.py and the
deadlock it prevents in tests/e2e/test_gang.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, cast

import pytest
from kubernetes.client import ApiClient

from tests.unit.operator.factories import (
    NAME,
    NOW,
    NS,
    ClientStandIn,
    api_error,
    job,
    job_obj,
    observed,
    raising,
    worker,
)
from torchflex_contract.labels import Label
from torchflex_contract.labels import PodKind as Role
from torchflex_operator.kube import Kube
from torchflex_operator.model.errors import AccessDeniedError, ApiAbsentError, RetryableError
from torchflex_operator.model.settings import Settings
from torchflex_operator.model.status import JobStatus
from torchflex_operator.model.vocabulary import GangScheduling
from torchflex_operator.planning import plan
from torchflex_operator.planning.rules import pacing
from torchflex_operator.render import builders
from torchflex_operator.render import podgroup as gang
from torchflex_operator.runtime.reconcile import Reconciler


@pytest.mark.parametrize(("min_replicas", "max_replicas"), [(1, 1), (2, 4), (3, 3)])
def test_pod_group_is_a_gang_of_the_minimum_owned_by_the_job(
    min_replicas: int, max_replicas: int
) -> None:
    spec = job(minReplicas=min_replicas, maxReplicas=max_replicas)
    group = gang.pod_group(spec)
    assert group["apiVersion"] == "scheduling.k8s.io/v1beta1"
    assert group["kind"] == "PodGroup"
    assert group["metadata"]["name"] == NAME
    assert group["metadata"]["namespace"] == NS
    assert group["spec"] == {"schedulingPolicy": {"gang": {"minCount": min_replicas}}}
    (owner,) = group["metadata"]["ownerReferences"]
    assert (owner["name"], owner["uid"], owner["controller"]) == (NAME, spec.uid, True)
    assert gang.min_count(group) == min_replicas


@pytest.mark.parametrize(
    ("mode", "linked"),
    [(None, False), (GangScheduling.UNAVAILABLE, False), (GangScheduling.ENABLED, True)],
)
def test_worker_pods_name_the_group_only_where_the_api_is_served(
    mode: GangScheduling | None, linked: bool
) -> None:
    spec = job()
    pod = builders.worker_pod(spec, 1, Settings(gang_scheduling=mode))
    expected = {"podGroupName": NAME} if linked else None
    assert pod["spec"].get("schedulingGroup") == expected
    # The link is not part of the template: finding the API rolls no pod.
    plain = builders.worker_pod(spec, 1, Settings())
    assert pod["metadata"]["annotations"] == plain["metadata"]["annotations"]


def _group(min_count: int | None, policy: str = "gang") -> dict[str, Any]:
    if policy == "basic":
        return {"spec": {"schedulingPolicy": {"basic": {}}}}
    return {"spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}}}


@pytest.mark.parametrize(
    ("existing", "min_replicas", "patch"),
    [
        (_group(2), 2, None),
        (_group(2), 3, {"spec": {"schedulingPolicy": {"gang": {"minCount": 3}}}}),
        (_group(4), 1, {"spec": {"schedulingPolicy": {"gang": {"minCount": 1}}}}),
        (_group(None, "basic"), 3, None),  # policy kind is immutable: not ours to change
        ({}, 3, None),
    ],
    ids=["in-step", "min-raised", "min-lowered", "basic-policy", "no-spec"],
)
def test_min_count_follows_min_replicas(
    existing: dict[str, Any], min_replicas: int, patch: dict[str, Any] | None
) -> None:
    want = gang.pod_group(job(minReplicas=min_replicas, maxReplicas=4))
    assert gang.min_count_patch(want, existing) == patch


@pytest.mark.parametrize(
    ("written", "min_replicas", "write"),
    [(None, 2, True), (2, 2, False), (2, 3, True)],
    ids=["never-written", "in-step", "spec-changed"],
)
def test_the_group_is_written_once_per_process_and_again_on_a_new_minimum(
    written: int | None, min_replicas: int, write: bool
) -> None:
    assert gang.needs_write(job(minReplicas=min_replicas, maxReplicas=4), written) is write


@pytest.mark.parametrize(
    ("served", "mode"), [(True, GangScheduling.ENABLED), (False, GangScheduling.UNAVAILABLE)]
)
def test_mode_says_which(served: bool, mode: GangScheduling) -> None:
    assert gang.mode(served) is mode


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [
        ({"gangScheduling": "Enabled"}, GangScheduling.ENABLED),
        ({"gangScheduling": "Unavailable"}, GangScheduling.UNAVAILABLE),
        ({"gangScheduling": "Sometimes"}, None),
        ({}, None),
    ],
)
def test_status_field_round_trips(raw: dict[str, Any], parsed: GangScheduling | None) -> None:
    status = JobStatus.parse(raw)
    assert status.gang_scheduling is parsed
    assert status.to_manifest().get("gangScheduling") == (
        None if parsed is None else raw["gangScheduling"]
    )


# -- the fallback: Kube's typed answers for a cluster without the API ---------------


def _kube(api: ClientStandIn) -> Kube:
    kube = Kube(ApiClient())
    kube.scheduling = api  # type: ignore[assignment]
    return kube


def _resources(*names: str) -> Callable[..., Any]:
    return lambda **_: SimpleNamespace(resources=[SimpleNamespace(name=n) for n in names])


@pytest.mark.parametrize(
    ("answer", "served"),
    [
        (raising(api_error(404)), False),  # group version not served at all
        (_resources("workloads"), False),  # served, but without PodGroups
        (_resources("workloads", "podgroups", "podgroups/status"), True),
    ],
    ids=["no-group-version", "no-podgroups", "served"],
)
def test_discovery_tells_whether_pod_groups_are_served(
    answer: Callable[..., Any], served: bool
) -> None:
    kube = _kube(ClientStandIn(get_api_resources=answer))
    assert asyncio.run(kube.pod_groups_served()) is served


def test_create_answered_404_is_api_absent_not_a_failed_pass() -> None:
    kube = _kube(ClientStandIn(create_namespaced_pod_group=raising(api_error(404))))
    with pytest.raises(ApiAbsentError, match="create podgroup ns/demo"):
        asyncio.run(kube.apply_pod_group(gang.pod_group(job())))


def test_create_refused_by_rbac_stays_access_denied() -> None:
    denied = api_error(403, 'User "system:serviceaccount:a:b" cannot create resource')
    kube = _kube(ClientStandIn(create_namespaced_pod_group=raising(denied)))
    with pytest.raises(AccessDeniedError):
        asyncio.run(kube.apply_pod_group(gang.pod_group(job())))


@pytest.mark.parametrize(("existing", "patched"), [(2, False), (3, True)])
def test_existing_group_gets_only_its_min_count_patched(existing: int, patched: bool) -> None:
    api = ClientStandIn(
        create_namespaced_pod_group=raising(api_error(409)),
        read_namespaced_pod_group=lambda *_, **__: _group(existing),
        patch_namespaced_pod_group=lambda *_, **__: {},
    )
    asyncio.run(_kube(api).apply_pod_group(gang.pod_group(job(minReplicas=2, maxReplicas=4))))
    patches = [c for c in api.calls if c[0] == "patch_namespaced_pod_group"]
    assert bool(patches) is patched
    if patched:
        ((_, args, kwargs),) = patches
        assert args[:3] == (NAME, NS, {"spec": {"schedulingPolicy": {"gang": {"minCount": 2}}}})
        assert kwargs["_content_type"] == "application/merge-patch+json"


# -- the fallback in the reconciler: asked once, remembered, said in status ---------


class _FakeKube:
    """The ``Kube`` methods one pass of a new job calls, recording them in order."""

    def __init__(self, served: bool, absent_on_create: bool = False) -> None:
        self.served = served
        self.absent_on_create = absent_on_create
        self.calls: list[str] = []
        self.pods: list[dict[str, Any]] = []
        self.status: dict[str, Any] = {}

    async def pod_groups_served(self) -> bool:
        self.calls.append("discovery")
        await asyncio.sleep(0)  # a request: other passes run meanwhile
        return self.served

    async def apply_pod_group(self, manifest: dict[str, Any]) -> None:
        self.calls.append("podgroup")
        if self.absent_on_create:
            raise ApiAbsentError("create podgroup ns/demo: HTTP 404")

    async def apply_disruption_budget(self, manifest: dict[str, Any]) -> None:
        self.calls.append("budget")

    async def patch_job_status(self, ns: str, name: str, rv: str, patch: Any) -> dict[str, Any]:
        self.calls.append("status")
        self.status.update(patch)
        return {**job_obj(), "status": dict(self.status)}

    async def create_pod(self, manifest: dict[str, Any]) -> str:
        self.calls.append("pod")
        self.pods.append(manifest)
        return f"uid-{len(self.pods)}"

    async def create_service(self, manifest: dict[str, Any]) -> bool:
        return True

    async def create_network_policy(self, manifest: dict[str, Any]) -> bool:
        return True

    async def post_event(self, *args: Any) -> None:
        return None


def _pass(kube: _FakeKube, reconciler: Reconciler | None = None) -> Reconciler:
    reconciler = reconciler or Reconciler(cast(Kube, kube), Settings())
    key = (NS, NAME)
    obj = job_obj(replicas=2)
    obj["metadata"]["resourceVersion"] = "1"
    reconciler.jobs[key] = obj
    reconciler._synced.add(key)
    asyncio.run(reconciler.reconcile(key))
    return reconciler


@pytest.mark.parametrize(
    ("served", "mode", "linked"),
    [(True, GangScheduling.ENABLED, True), (False, GangScheduling.UNAVAILABLE, False)],
)
def test_a_pass_asks_once_links_pods_only_when_served_and_says_which(
    served: bool, mode: GangScheduling, linked: bool
) -> None:
    kube = _FakeKube(served)
    reconciler = _pass(kube)
    assert kube.status["gangScheduling"] == mode.value
    workers = [p for p in kube.pods if p["metadata"]["labels"][Label.ROLE] == Role.WORKER]
    assert len(workers) == 2
    assert all(("schedulingGroup" in p["spec"]) is linked for p in workers)
    # The store is outside the gang: the group waits for it, not the other way round.
    assert all("schedulingGroup" not in p["spec"] for p in kube.pods if p not in workers)
    if linked:  # the group exists before the first pod names it
        assert kube.calls.index("podgroup") < kube.calls.index("pod")
    else:
        assert "podgroup" not in kube.calls
    _pass(kube, reconciler)  # the answer is remembered: no second discovery
    assert kube.calls.count("discovery") == 1
    assert kube.calls.count("podgroup") == (1 if linked else 0)


def test_a_group_answered_404_after_discovery_asks_again_next_pass() -> None:
    kube = _FakeKube(served=True, absent_on_create=True)
    reconciler = Reconciler(cast(Kube, kube), Settings())
    with pytest.raises(RetryableError, match="create podgroup"):
        _pass(kube, reconciler)
    assert "pod" not in kube.calls  # no pod names a group that is not there
    assert reconciler.settings.gang_scheduling is None
    kube.served, kube.absent_on_create = False, False
    _pass(kube, reconciler)
    assert kube.calls.count("discovery") == 2
    assert kube.status["gangScheduling"] == GangScheduling.UNAVAILABLE.value
    assert kube.pods and not any("schedulingGroup" in p["spec"] for p in kube.pods)


# -- pacing: a gang's minimum is created at once ------------------------------------


@pytest.mark.parametrize(
    ("at_once", "unscheduled", "allowed", "capped"),
    [
        (0, 16, 0, False),  # no gang: wait for the first batch to get nodes
        (20, 16, 4, False),  # a gang of 20: the rest of it, or no pod of it is ever placed
        (20, 0, 20, False),
        (100, 64, 36, False),  # the cap on pending pods is raised to the gang too
        (100, 100, 0, True),
        (3, 16, 0, False),  # a gang below the batch changes nothing
    ],
)
def test_pacing_lets_a_whole_gang_wait_for_nodes(
    at_once: int, unscheduled: int, allowed: int, capped: bool
) -> None:
    pending = [worker(i, "Pending", node_name=None) for i in range(unscheduled)]
    got = pacing.budget(pending, Settings(), at_once)
    assert (got.allowed, got.capped) == (allowed, capped)


@pytest.mark.parametrize(
    ("mode", "created"), [(GangScheduling.ENABLED, 20), (GangScheduling.UNAVAILABLE, 16)]
)
def test_first_pass_creates_a_gang_of_20_whole(mode: GangScheduling, created: int) -> None:
    big = job(minReplicas=20, maxReplicas=24, replicas=20)
    assert gang.pods_at_once(big, Settings(gang_scheduling=mode)) == (
        20 if mode is GangScheduling.ENABLED else 0
    )
    first = plan(big, JobStatus(), observed(), NOW, Settings(gang_scheduling=mode))
    workers = [p for p in first.create_pods if p["metadata"]["labels"][Label.ROLE] == Role.WORKER]
    assert len(workers) == created


def test_workers_first_passes_ask_discovery_once_between_them() -> None:
    kube = _FakeKube(served=True)
    reconciler = Reconciler(cast(Kube, kube), Settings())

    async def first_passes() -> list[GangScheduling]:
        return list(await asyncio.gather(*(reconciler._gang_mode() for _ in range(4))))

    assert asyncio.run(first_passes()) == [GangScheduling.ENABLED] * 4
    assert kube.calls.count("discovery") == 1
