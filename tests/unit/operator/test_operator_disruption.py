"""Voluntary disruptions: the job's PodDisruptionBudget and the autoscaler's annotation.

Pure tables for ``disruption`` and the pod builders; ``Kube``'s create-or-patch
and owner-checked delete against a stand-in for the client's ``PolicyV1Api``;
the reconciler's write / rewrite / delete-when-finished bookkeeping, and a
budget it may not write (Warning Event, the pass goes on), against a recording
stand-in for ``Kube``. What a real drain does with the budget is proved in
tests/e2e/test_autoscaler.py.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from kubernetes.client import ApiClient

from tests.unit.operator.factories import (
    NAME,
    NS,
    ClientStandIn,
    api_error,
    job,
    job_obj,
    raising,
)
from torchflex_contract.labels import Label
from torchflex_operator.kube import Kube
from torchflex_operator.model.errors import NotOursError
from torchflex_operator.model.settings import Settings
from torchflex_operator.model.vocabulary import AutoscalerAnnotation, EventReason
from torchflex_operator.render import backends, builders
from torchflex_operator.render import pdb as disruption
from torchflex_operator.runtime.reconcile import Reconciler

SAFE = AutoscalerAnnotation.SAFE_TO_EVICT.value


def _selects(selector: dict[str, Any], pod: dict[str, Any]) -> bool:
    have = pod["metadata"]["labels"]
    return all(have.get(k) == v for k, v in selector["matchLabels"].items())


@pytest.mark.parametrize(("min_replicas", "max_replicas"), [(1, 1), (2, 4), (3, 8)])
def test_budget_holds_the_minimum_of_the_workers_only(min_replicas: int, max_replicas: int) -> None:
    spec = job(minReplicas=min_replicas, maxReplicas=max_replicas)
    pdb = disruption.pod_disruption_budget(spec)
    assert (pdb["apiVersion"], pdb["kind"]) == ("policy/v1", "PodDisruptionBudget")
    assert (pdb["metadata"]["name"], pdb["metadata"]["namespace"]) == (NAME, NS)
    assert pdb["metadata"]["ownerReferences"][0]["uid"] == spec.uid
    assert pdb["spec"]["minAvailable"] == min_replicas
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    selector = pdb["spec"]["selector"]
    workers = [builders.worker_pod(spec, i, Settings()) for i in range(max_replicas)]
    assert all(_selects(selector, w) for w in workers)
    for aux in (backends.store_pod(spec, Settings()), backends.etcd_pod(spec, Settings())):
        assert not _selects(selector, aux)  # never drained: see disruption


_WANT = disruption.pod_disruption_budget(job(minReplicas=2, maxReplicas=4))
_SELECTOR = _WANT["spec"]["selector"]
_OURS = {"uid": "pdb-uid", "ownerReferences": _WANT["metadata"]["ownerReferences"]}
_OURS_UID = _WANT["metadata"]["ownerReferences"][0]["uid"]


@pytest.mark.parametrize(
    ("current", "patch"),
    [
        (_WANT["spec"], None),
        ({**_WANT["spec"], "maxUnavailable": None}, None),  # a field we do not own
        ({**_WANT["spec"], "minAvailable": 3}, {"minAvailable": 2}),
        (
            {**_WANT["spec"], "unhealthyPodEvictionPolicy": "IfHealthyBudget"},
            {"unhealthyPodEvictionPolicy": "AlwaysAllow"},
        ),
        (
            {**_WANT["spec"], "selector": {"matchLabels": {Label.JOB_NAME.value: NAME}}},
            {"selector": {"matchExpressions": None, **_SELECTOR}},
        ),
    ],
    ids=["same", "unowned-field", "min", "unhealthy-policy", "selector"],
)
def test_spec_patch_brings_back_only_the_owned_fields(
    current: dict[str, Any], patch: dict[str, Any] | None
) -> None:
    got = disruption.spec_patch(_WANT, {"metadata": _OURS, "spec": current})
    assert got == (None if patch is None else {"spec": patch})


@pytest.mark.parametrize(
    "meta",
    [{}, {"ownerReferences": [{"kind": "ElasticJob", "name": NAME, "uid": "another-job"}]}],
    ids=["no-owner", "other-owner"],
)
def test_a_budget_the_job_does_not_own_is_never_patched(meta: dict[str, Any]) -> None:
    with pytest.raises(NotOursError, match="does not own"):
        disruption.spec_patch(_WANT, {"metadata": meta, "spec": {"minAvailable": 0}})


@pytest.mark.parametrize(("written", "needed"), [(None, True), (2, False), (1, True), (3, True)])
def test_written_once_per_minimum(written: int | None, needed: bool) -> None:
    assert disruption.needs_write(job(minReplicas=2, maxReplicas=4), written) is needed


@pytest.mark.parametrize(
    ("template_annotations", "worker_value"),
    [({}, "true"), ({SAFE: "false"}, "false"), ({"other": "x"}, "true")],
    ids=["default", "template-wins", "unrelated"],
)
def test_workers_may_be_drained_rendezvous_hosts_not(
    template_annotations: dict[str, str], worker_value: str
) -> None:
    template = job_obj()["spec"]["template"]
    template["metadata"] = {"annotations": template_annotations}
    spec = job(template=template)
    pod = builders.worker_pod(spec, 0, Settings())
    assert pod["metadata"]["annotations"][SAFE] == worker_value
    assert {k: pod["metadata"]["annotations"][k] for k in template_annotations} == (
        template_annotations
    )
    for aux in (backends.store_pod(spec, Settings()), backends.etcd_pod(spec, Settings())):
        assert aux["metadata"]["annotations"] == {SAFE: "false"}


# -- Kube: create, or patch only what differs -----------------------------------------


def _kube(api: ClientStandIn) -> Kube:
    kube = Kube(ApiClient())
    kube.policy = api  # type: ignore[assignment]
    return kube


@pytest.mark.parametrize(("existing", "patched"), [(2, False), (1, True)])
def test_existing_budget_gets_only_its_difference_patched(existing: int, patched: bool) -> None:
    current = {**_WANT, "spec": {**_WANT["spec"], "minAvailable": existing}}
    api = ClientStandIn(
        create_namespaced_pod_disruption_budget=raising(api_error(409)),
        read_namespaced_pod_disruption_budget=lambda *_, **__: current,
        patch_namespaced_pod_disruption_budget=lambda *_, **__: {},
    )
    asyncio.run(_kube(api).apply_disruption_budget(_WANT))
    patches = [c for c in api.calls if c[0] == "patch_namespaced_pod_disruption_budget"]
    assert bool(patches) is patched
    if patched:
        ((_, args, kwargs),) = patches
        assert args == (NAME, NS, {"spec": {"minAvailable": 2}})
        assert kwargs["_content_type"] == "application/merge-patch+json"


def test_an_existing_budget_of_another_owner_is_left_alone() -> None:
    current = {**_WANT, "metadata": {**_WANT["metadata"], "ownerReferences": []}}
    api = ClientStandIn(
        create_namespaced_pod_disruption_budget=raising(api_error(409)),
        read_namespaced_pod_disruption_budget=lambda *_, **__: current,
        patch_namespaced_pod_disruption_budget=lambda *_, **__: {},
    )
    with pytest.raises(NotOursError):
        asyncio.run(_kube(api).apply_disruption_budget(_WANT))
    assert not [c for c in api.calls if c[0] == "patch_namespaced_pod_disruption_budget"]


@pytest.mark.parametrize(
    ("meta", "read_answer", "deleted"),
    [
        (_OURS, None, True),
        (None, api_error(404), False),  # gone already: no error
        ({"uid": "user-pdb", "ownerReferences": []}, None, False),  # a user's: never deleted
    ],
    ids=["ours", "missing", "not-ours"],
)
def test_delete_takes_only_the_jobs_own_budget(
    meta: dict[str, Any] | None, read_answer: Exception | None, deleted: bool
) -> None:
    current = {"metadata": meta, "spec": {}}
    api = ClientStandIn(
        read_namespaced_pod_disruption_budget=(
            raising(read_answer) if read_answer else lambda *_, **__: current
        ),
        delete_namespaced_pod_disruption_budget=lambda *_, **__: {},
    )
    assert asyncio.run(_kube(api).delete_disruption_budget(NS, NAME, _OURS_UID)) is deleted
    deletes = [c for c in api.calls if c[0] == "delete_namespaced_pod_disruption_budget"]
    assert len(deletes) == int(deleted)
    if deleted:
        ((_, _, kwargs),) = deletes
        assert kwargs["body"].preconditions.uid == "pdb-uid"  # not one made anew meanwhile


# -- the reconciler: written once, again on a new minimum, deleted when finished ------


class _FakeKube:
    """The ``Kube`` methods a pass calls, recording the budget's writes."""

    def __init__(self, refuse: Exception | None = None) -> None:
        self.budgets: list[tuple[str, Any]] = []
        self.status: dict[str, Any] = {}
        self.events: list[tuple[str, str]] = []
        self.refuse = refuse

    async def pod_groups_served(self) -> bool:
        return False

    async def apply_disruption_budget(self, manifest: dict[str, Any]) -> None:
        self.budgets.append(("apply", manifest["spec"]["minAvailable"]))
        if self.refuse is not None:
            raise self.refuse

    async def delete_disruption_budget(self, namespace: str, name: str, owner_uid: str) -> bool:
        self.budgets.append(("delete", name))
        return True

    async def patch_job_status(self, ns: str, name: str, rv: str, patch: Any) -> dict[str, Any]:
        self.status.update(patch)
        return {**job_obj(), "status": dict(self.status)}

    async def create_pod(self, manifest: dict[str, Any]) -> str:
        return "uid"

    async def create_service(self, manifest: dict[str, Any]) -> bool:
        return True

    async def create_network_policy(self, manifest: dict[str, Any]) -> bool:
        return True

    async def delete_pod(self, *args: Any, **kwargs: Any) -> bool:
        return True

    async def post_event(self, obj: Any, etype: str, reason: str, *_: Any) -> None:
        self.events.append((etype, reason))


@pytest.mark.parametrize(
    ("passes", "writes"),
    [
        ([{}, {}], [("apply", 2)]),
        ([{}, {"minReplicas": 3}], [("apply", 2), ("apply", 3)]),
        ([{}, {"status": "Succeeded"}, {"status": "Succeeded"}], [("apply", 2), ("delete", NAME)]),
        ([{"status": "Failed"}], [("delete", NAME)]),  # after a restart: delete once
        # Not on every resync: an idle operator sends no request.
        ([{"resync_s": 0.0}, {"resync_s": 0.0}], [("apply", 2)]),
    ],
    ids=["once", "new-minimum", "finished", "finished-before-start", "resync"],
)
def test_reconciler_writes_the_budget_once_per_minimum_and_deletes_it_when_finished(
    passes: list[dict[str, Any]], writes: list[tuple[str, Any]]
) -> None:
    kube = _FakeKube()
    key = (NS, NAME)
    reconciler = Reconciler(cast(Kube, kube), Settings(resync_s=passes[0].get("resync_s", 60.0)))
    for change in passes:
        obj = job_obj(replicas=2, minReplicas=change.get("minReplicas", 2))
        obj["metadata"]["resourceVersion"] = "1"
        if "status" in change:
            obj["status"] = {"phase": change["status"]}
        reconciler.jobs[key] = obj
        reconciler._synced.add(key)
        asyncio.run(reconciler.reconcile(key))
    assert kube.budgets == writes


def test_a_budget_that_cannot_be_written_is_a_warning_and_the_pass_goes_on() -> None:
    kube = _FakeKube(refuse=NotOursError("a PodDisruptionBudget ns/demo exists ..."))
    reconciler = Reconciler(cast(Kube, kube), Settings(resync_s=0.0))
    key = (NS, NAME)
    for _ in range(2):
        obj = job_obj(replicas=2, minReplicas=2)
        obj["metadata"]["resourceVersion"] = "1"
        reconciler.jobs[key] = obj
        reconciler._synced.add(key)
        asyncio.run(reconciler.reconcile(key))
    assert kube.budgets == [("apply", 2), ("apply", 2)]  # tried again each pass
    warnings = [e for e in kube.events if e[1] == EventReason.BUDGET_NOT_APPLIED.value]
    assert warnings == [("Warning", EventReason.BUDGET_NOT_APPLIED.value)]  # said once
    assert kube.status.get("phase")  # the pass went on and wrote the job's status
