"""Expectations, the watch cache, the work queue, status patches and the CLI flags."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import cast

import pytest
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import MaxRetryError, NewConnectionError, ProtocolError

from tests.unit.operator.factories import NOW, worker
from torchflex_contract import labels
from torchflex_operator.cli import LeaseConfig, deprecations, lease_config, parser, settings_from
from torchflex_operator.kube import Kube
from torchflex_operator.kube.transport import _typed
from torchflex_operator.model.errors import (
    AccessDeniedError,
    ConflictError,
    PermanentError,
    RetryableError,
)
from torchflex_operator.model.settings import Settings
from torchflex_operator.model.status import merge_patch
from torchflex_operator.planning.lease import Timing
from torchflex_operator.runtime.cache import NodeCache, OwnedCache
from torchflex_operator.runtime.expectations import TIMEOUT, Expectations
from torchflex_operator.runtime.reconcile import RIGHTS_WITHDRAWN, Reconciler
from torchflex_operator.runtime.workqueue import WorkQueue

JOB = ("ns", "demo")


def test_created_pod_is_seen_until_cache_catches_up() -> None:
    exp = Expectations()
    exp.expect_created(JOB, worker(1, "Pending", uid="new"), NOW)
    assert [p.name for p in exp.overlay(JOB, [], NOW)] == [labels.worker_pod_name("demo", 1)]
    assert [p.uid for p in exp.overlay(JOB, [worker(1, uid="new")], NOW)] == ["new"]
    assert exp.pending(JOB) == 0


def test_deleted_pod_looks_terminating_until_cache_catches_up() -> None:
    exp = Expectations()
    exp.expect_deleted(JOB, "uid-0", NOW, forced=False)
    (view,) = exp.overlay(JOB, [worker(0)], NOW)
    assert view.terminating
    assert exp.overlay(JOB, [], NOW) == []
    assert exp.pending(JOB) == 0


def test_created_pod_already_seen_and_deleted_is_not_resurrected() -> None:
    """The watch showed the new pod and its deletion before the next pass ran
    (or even before the create call returned): the job must see the loss now,
    not after the expectation's timeout."""
    cache = OwnedCache()
    exp = Expectations()
    name = labels.worker_pod_name("demo", 1)
    cache.update_pod("ADDED", pod_obj(name, "new"))
    cache.update_pod("DELETED", pod_obj(name, "new"))
    exp.expect_created(JOB, worker(1, "Pending", uid="new"), NOW)
    assert exp.overlay(JOB, cache.job_pods(JOB), NOW, cache.seen_uids(JOB)) == []
    assert exp.pending(JOB) == 0


def test_expectations_expire() -> None:
    exp = Expectations()
    exp.expect_created(JOB, worker(1, "Pending", uid="new"), NOW)
    assert exp.overlay(JOB, [], NOW + TIMEOUT + dt.timedelta(seconds=1)) == []


def pod_obj(name: str, uid: str, job: str = "demo") -> dict[str, object]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": uid,
            "labels": {labels.Label.JOB_NAME: job, labels.Label.ROLE: "worker"},
        },
        "spec": {"nodeName": "n1"},
    }


def test_cache_tracks_pods_by_job_and_ignores_stale_delete() -> None:
    cache = OwnedCache()
    key = cache.update_pod("ADDED", pod_obj("demo-worker-0", "a"))
    assert key == ("ns", "demo")
    cache.update_pod("ADDED", pod_obj("demo-worker-0", "b"))  # recreated under same name
    cache.update_pod("DELETED", pod_obj("demo-worker-0", "a"))  # late delete of the old one
    assert [p.uid for p in cache.job_pods(key)] == ["b"]
    assert cache.jobs_on_node("n1") == {key}
    assert cache.update_pod("ADDED", {"metadata": {"name": "x"}}) is None


def test_node_cache() -> None:
    nodes = NodeCache()
    ready = {
        "metadata": {"name": "n"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    assert nodes.update(None, ready) == ("n", True)
    assert nodes.update("MODIFIED", ready) == ("n", False)
    assert nodes.update("DELETED", ready) == ("n", True)
    assert nodes.ready == {}


def test_status_patch_nulls_removed_keys() -> None:
    old = {"phase": "Running", "belowMinSince": "x", "replicas": 2}
    new = {"phase": "Running", "replicas": 3}
    assert merge_patch(old, new) == {"replicas": 3, "belowMinSince": None}


def test_workqueue_dedupes_and_delays() -> None:
    async def scenario() -> list[str]:
        q: WorkQueue[str] = WorkQueue()
        q.add("a", 0.05)
        q.add("a")  # an earlier add wins
        q.add("b", 10)
        first = await asyncio.wait_for(q.get(), 1)
        q.add("a")  # re-added while active: runs again after done()
        assert len(q) == 1  # only "b" is waiting
        q.done(first)
        second = await asyncio.wait_for(q.get(), 1)
        q.done(second)
        return [first, second]

    assert asyncio.run(scenario()) == ["a", "a"]


def test_cli_flags() -> None:
    args = parser().parse_args(["-n", "a", "-n", "b", "--log-format", "json", "--standalone"])
    assert args.namespace == ["a", "b"] and args.log_format == "json"
    ha = parser().parse_args(["-n", "a", "--lease", "p", "--lease-namespace", "ops"])
    assert lease_config(ha, None) == LeaseConfig("ops", "p", Timing(15, 10.0, 2.0))
    assert deprecations(ha) == []
    # Outside a pod, a single plain -n namespace holds the Lease; in a pod, its own namespace.
    assert lease_config(parser().parse_args(["-n", "a", "--lease", "p"]), None) == LeaseConfig(
        "a", "p", Timing(15, 10.0, 2.0)
    )
    tuned = parser().parse_args(["--lease", "p", "--lease-duration", "6", "--retry-period", "1"])
    assert lease_config(tuned, "pod-ns") == LeaseConfig("pod-ns", "p", Timing(6, 4.0, 1.0))
    assert lease_config(parser().parse_args(["--standalone"]), "pod-ns") is None
    # The kopf-peering flags of earlier releases still work, with a warning each.
    old = parser().parse_args(["-n", "a", "--peering", "p", "--priority", "oldest",
                               "--peering-lifetime", "30"])  # fmt: skip
    assert lease_config(old, None) == LeaseConfig("a", "p", Timing(30, 20.0, 4.0))
    assert [w.split(" ", 1)[0] for w in deprecations(old)] == [
        "--peering", "--peering-lifetime", "--priority"
    ]  # fmt: skip
    for bad_lease in (
        ["--lease", "p"],  # no namespace to put it in
        ["-n", "a*", "--lease", "p"],
        ["--lease", "p", "--lease-namespace", "x", "--renew-deadline", "20"],
    ):
        with pytest.raises(ValueError, match="lease"):
            lease_config(parser().parse_args(bad_lease), None)
    assert parser().parse_args([]).resync == 300
    paced = settings_from(parser().parse_args(["--max-pending-pods", "8", "--create-batch", "2"]))
    assert (paced.max_unscheduled, paced.create_batch_initial) == (8, 2)
    for bad in (
        ["--max-pending-pods", "0"],
        ["--create-batch", "x"],
        ["-n", "a", "-A"],
        ["--log-format", "xml"],
        ["--peering", "p", "--standalone"],
        ["--lease", "p", "--standalone"],
        ["--lease-duration", "0"],
        ["--retry-period", "-1"],
        ["--priority", "newest"],
    ):
        with pytest.raises(SystemExit) as exc:
            parser().parse_args(bad)
        assert exc.value.code == 2


RBAC_DENIAL = (
    '{"kind":"Status","status":"Failure","message":"elasticjobs.torchflex.io \\"a\\" is '
    'forbidden: User \\"system:serviceaccount:tf:op\\" cannot get resource \\"elasticjobs\\"'
    ' in API group \\"torchflex.io\\" in the namespace \\"ns\\"","reason":"Forbidden",'
    '"code":403}'
)
PSA_DENIAL = (
    '{"kind":"Status","status":"Failure","message":"pods \\"a-worker-0\\" is forbidden: '
    'violates PodSecurity \\"restricted:latest\\": privileged","reason":"Forbidden",'
    '"code":403}'
)


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (403, RBAC_DENIAL, AccessDeniedError),
        (403, PSA_DENIAL, PermanentError),
        (422, "{}", PermanentError),
        (409, "{}", ConflictError),
        (503, "{}", RetryableError),
    ],
)
def test_api_errors_are_typed_by_what_they_mean(
    status: int, body: str, expected: type[Exception]
) -> None:
    exc = ApiException(status=status, reason="x")
    exc.body = body
    typed = _typed(exc, "get elasticjob ns/a")
    assert type(typed) is expected
    assert f"HTTP {status}" in str(typed)


def test_withdrawn_rights_warn_once_not_per_job(caplog: pytest.LogCaptureFixture) -> None:
    """helm uninstall removes the RBAC before the operator stops: one warning, no errors."""
    reconciler = Reconciler(cast(Kube, object()), Settings())
    denied = AccessDeniedError("get elasticjob ns/a: HTTP 403 Forbidden")
    with caplog.at_level(logging.DEBUG, logger="torchflex_operator.runtime.reconcile"):
        for n in range(5):
            reconciler._rights_refused(("ns", f"job-{n}"), denied)
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and RIGHTS_WITHDRAWN in warned[0].getMessage()
    assert warned[0].levelno == logging.WARNING
    assert sum(r.levelno == logging.DEBUG for r in caplog.records) == 4


@pytest.mark.parametrize(
    "failure",
    [
        MaxRetryError(None, "/api", reason=NewConnectionError(None, "Connection refused")),  # type: ignore[arg-type]
        ProtocolError("Connection aborted.", ConnectionResetError()),
        ConnectionRefusedError(111, "Connection refused"),
        TimeoutError("read timed out"),
    ],
    ids=["max-retries", "protocol", "refused", "timeout"],
)
def test_an_unreachable_api_server_is_retryable_not_a_crash(failure: Exception) -> None:
    """The client's retries end in urllib3's MaxRetryError while the API server restarts."""

    def call() -> None:
        raise failure

    with pytest.raises(RetryableError, match="get elasticjob ns/a"):
        asyncio.run(Kube(ApiClient())._call("get elasticjob ns/a", call))
