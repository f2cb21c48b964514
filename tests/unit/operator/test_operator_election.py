"""Leader election on a Lease: the pure rules (tables) and the gate's loop against an
in-memory Lease store that enforces resourceVersion like the API server."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any, cast

import pytest
from kubernetes.client import ApiClient

from tests.unit.operator.factories import NOW
from torchflex_operator.kube import Kube
from torchflex_operator.model.errors import AccessDeniedError, ConflictError, NotLeaderError
from torchflex_operator.model.settings import Settings
from torchflex_operator.planning.lease import (
    Action,
    Observed,
    Record,
    Timing,
    decide,
    leading,
    released,
)
from torchflex_operator.runtime.handlers import register
from torchflex_operator.runtime.leader import Gate, LeaseGate
from torchflex_operator.runtime.reconcile import Reconciler

T = Timing(15, 10.0, 2.0)
EARLIER = NOW - dt.timedelta(hours=1)


def held(holder: str, changed_at: float = 100.0, duration: int = 15, n: int = 3) -> Observed:
    return Observed(Record(holder, duration, EARLIER, EARLIER, n), "7", changed_at)


@pytest.mark.parametrize(
    ("observed", "renewed_at", "now", "action", "next_in"),
    [
        (None, None, 100.0, Action.WAIT, 0.0),  # nothing read yet: read first
        (Observed(None, None, 100.0), None, 100.0, Action.CREATE, 2.0),  # no Lease yet
        (held("me"), 100.0, 101.0, Action.WAIT, 1.0),  # ours, renewed 1 s ago
        (held("me"), 100.0, 102.0, Action.RENEW, 2.0),  # ours, due
        (held("me"), None, 100.0, Action.RENEW, 2.0),  # ours after a restart: renew now
        (held("other"), None, 114.9, Action.WAIT, 2.0),  # another's, unchanged 14.9 s
        (held("other"), None, 115.0, Action.TAKE, 2.0),  # unchanged for its duration
        (held("other", duration=60), None, 130.0, Action.WAIT, 2.0),  # its duration counts
        (held(""), None, 100.0, Action.TAKE, 2.0),  # released: take it at once
    ],
)
def test_decide_follows_client_go(
    observed: Observed | None,
    renewed_at: float | None,
    now: float,
    action: Action,
    next_in: float,
) -> None:
    decision = decide(observed, renewed_at, "me", T, now, NOW)
    assert decision.action is action
    assert decision.next_in == pytest.approx(next_in)
    if action is Action.WAIT:
        assert decision.write is None
        return
    assert decision.write is not None
    assert decision.write.holder == "me" and decision.write.renew_time == NOW
    assert decision.write.lease_duration_s == T.lease_duration_s
    if action is Action.CREATE:
        assert (decision.write.transitions, decision.write.acquire_time) == (0, NOW)
    elif action is Action.TAKE:
        assert (decision.write.transitions, decision.write.acquire_time) == (4, NOW)
    else:  # a renewal keeps when and how often it changed hands
        assert (decision.write.transitions, decision.write.acquire_time) == (3, EARLIER)


def test_expiry_never_reads_the_records_timestamps() -> None:
    # The holder's clock is an hour behind ours: its renewTime says nothing to us,
    # only that the record changed just now does.
    skewed = held("other", changed_at=500.0)
    assert decide(skewed, None, "me", T, 501.0, NOW).action is Action.WAIT
    assert decide(skewed, None, "me", T, 515.0, NOW).action is Action.TAKE


@pytest.mark.parametrize(
    ("observed", "renewed_at", "now", "expected"),
    [
        (held("me"), 100.0, 109.9, True),
        (held("me"), 100.0, 110.0, False),  # the renew deadline passed: stop reconciling
        (held("me"), None, 100.0, False),  # named in the record, never renewed by us
        (held("other"), 100.0, 101.0, False),  # someone took it: at once, whatever we did
        (Observed(None, None, 0.0), 100.0, 101.0, False),
        (None, 100.0, 101.0, False),
    ],
)
def test_leading_only_within_the_renew_deadline(
    observed: Observed | None, renewed_at: float | None, now: float, expected: bool
) -> None:
    assert leading(observed, renewed_at, "me", T, now) is expected


def test_holder_stops_before_anyone_may_take_over() -> None:
    # The holder's last write started at 100; others saw it at 100.3 at the earliest.
    times = [t / 10 for t in range(1000, 1200)]
    last_leading = max(t for t in times if leading(held("me"), 100.0, "me", T, t))
    seen = held("me", changed_at=100.3)
    first_take = min(t for t in times if decide(seen, None, "x", T, t, NOW).action is Action.TAKE)
    assert first_take - last_leading >= T.lease_duration_s - T.renew_deadline_s


@pytest.mark.parametrize(
    ("timing", "problem"),
    [
        (Timing(15, 10, 2), None),
        (Timing(0, 0.5, 0.1), "at least 1 s"),
        (Timing(10, 10, 2), "shorter than the lease duration"),
        (Timing(15, 2.3, 2), "1.2 x the retry period"),
        (Timing(15, 10, 0), "positive"),
    ],
)
def test_timing_constraints(timing: Timing, problem: str | None) -> None:
    problems = timing.problems()
    assert (problems == []) if problem is None else any(problem in p for p in problems)


def test_scaled_defaults_are_client_gos() -> None:
    assert Timing.scaled(15) == Timing(15, 10.0, 2.0)
    assert Timing.scaled(6).problems() == []


def test_record_round_trips_the_lease_spec() -> None:
    record = Record("pod-a", 15, NOW, NOW + dt.timedelta(microseconds=1500), 2)
    spec = record.spec()
    assert spec["renewTime"] == "2025-01-01T12:00:00.001500Z"  # MicroTime
    assert Record.from_spec(spec) == record
    assert Record.from_spec(None) == Record("", 0, None, None, 0)
    assert Record.from_spec({"leaseDurationSeconds": "x", "holderIdentity": "a"}).holder == "a"
    free = released(record, NOW)
    assert (free.holder, free.lease_duration_s, free.transitions) == ("", 1, 2)
    assert free.spec()["holderIdentity"] is None


def test_seen_again_moves_changed_at_only_on_a_change() -> None:
    first = held("other", changed_at=10.0)
    same = first.seen_again(first.record, "8", 20.0)
    assert (same.changed_at, same.resource_version) == (10.0, "8")
    assert first.record is not None
    renewed = dataclasses.replace(first.record, renew_time=NOW)
    assert first.seen_again(renewed, "9", 20.0).changed_at == 20.0


# -- the gate's loop against an in-memory Lease store ------------------------------------


class LeaseStore:
    """One Lease with the API server's rules: create refuses an existing one, an
    update needs the current resourceVersion; ``refuse`` makes one replica's calls fail."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.refuse: set[str] = set()

    def client(self, who: str) -> Client:
        return Client(self, who)

    def _check(self, who: str) -> None:
        if who in self.refuse:
            raise AccessDeniedError(f'User "{who}" cannot update leases')

    def _stored(self, name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
        self.version += 1
        self.lease = {
            "metadata": {"name": name, "resourceVersion": str(self.version)},
            "spec": dict(spec),
        }
        return dict(self.lease)


@dataclasses.dataclass
class Client:
    store: LeaseStore
    who: str

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.store._check(self.who)
        return None if self.store.lease is None else dict(self.store.lease)

    async def create_lease(
        self, namespace: str, name: str, spec: Mapping[str, Any]
    ) -> dict[str, Any]:
        self.store._check(self.who)
        if self.store.lease is not None:
            raise ConflictError("create lease: already exists")
        return self.store._stored(name, spec)

    async def replace_lease(
        self, namespace: str, name: str, resource_version: str, spec: Mapping[str, Any]
    ) -> dict[str, Any]:
        self.store._check(self.who)
        if self.store.lease is None or resource_version != str(self.store.version):
            raise ConflictError("update lease: the object has been modified")
        return self.store._stored(name, spec)


@dataclasses.dataclass
class Hanging(Client):
    """A client whose renewals do not answer until ``answer`` is set."""

    answer: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    async def replace_lease(
        self, namespace: str, name: str, resource_version: str, spec: Mapping[str, Any]
    ) -> dict[str, Any]:
        await self.answer.wait()
        return await super().replace_lease(namespace, name, resource_version, spec)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def gate(store: LeaseStore, who: str, clock: Clock) -> LeaseGate:
    def wall() -> dt.datetime:  # the wall clock moves with the monotonic one
        return NOW + dt.timedelta(seconds=clock.now)

    return LeaseGate(store.client(who), "ns", "torchflex", who, T, clock=clock, wall=wall)


async def settle(*gates: LeaseGate) -> None:
    """One step of each gate (as their loops would), then their gates re-evaluated."""
    for g in gates:
        try:
            await g.step()
        except AccessDeniedError as exc:
            g._failed(exc)
        g.evaluate()


def test_one_leads_the_other_stands_by_then_takes_over_after_the_holder_stops_renewing() -> None:
    async def scenario() -> None:
        store, clock = LeaseStore(), Clock()
        a, b = gate(store, "a", clock), gate(store, "b", clock)
        await settle(a, b)
        assert a.active and not b.active
        assert store.lease is not None and store.lease["spec"]["holderIdentity"] == "a"
        for _ in range(20):  # a renews every retry period; b keeps standing by
            clock.now += T.retry_period_s
            await settle(a, b)
            assert a.active and not b.active
        assert store.lease["spec"]["leaseTransitions"] == 0

        store.refuse.add("a")  # a's renewals fail from now on (its rights, a partition...)
        closed_at = opened_at = None
        step = 0.1
        for _ in range(200):
            clock.now += step
            await settle(a, b)
            if closed_at is None and not a.active:
                closed_at = clock.now
            if opened_at is None and b.active:
                opened_at = clock.now
        assert closed_at is not None and opened_at is not None
        # a stopped reconciling well before b could start: never two leaders at once.
        assert opened_at - closed_at >= T.lease_duration_s - T.renew_deadline_s - step
        assert store.lease["spec"]["holderIdentity"] == "b"
        assert store.lease["spec"]["leaseTransitions"] == 1

    asyncio.run(scenario())


def test_two_standbys_racing_for_an_expired_lease_elect_one() -> None:
    async def scenario() -> None:
        store, clock = LeaseStore(), Clock()
        gone, b, c = gate(store, "gone", clock), gate(store, "b", clock), gate(store, "c", clock)
        await settle(gone)
        await b._read()
        await c._read()
        clock.now += T.lease_duration_s
        await settle(b, c)  # both decide TAKE from the same resourceVersion
        assert [b.active, c.active] == [True, False]
        assert store.lease is not None and store.lease["spec"]["holderIdentity"] == "b"
        await settle(c)
        assert not c.active  # it read the new holder

    asyncio.run(scenario())


def test_a_stopping_holder_releases_and_the_standby_takes_over_at_once() -> None:
    async def scenario() -> None:
        store, clock = LeaseStore(), Clock()
        a, b = gate(store, "a", clock), gate(store, "b", clock)
        changes: list[bool] = []
        a.on_change = changes.append
        await settle(a, b)
        await a.stop()
        assert changes == [True, False]
        assert store.lease is not None and store.lease["spec"]["holderIdentity"] is None
        await settle(b)  # no wait for the expiry
        assert b.active and store.lease["spec"]["holderIdentity"] == "b"
        assert store.lease["spec"]["leaseTransitions"] == 1

    asyncio.run(scenario())


def test_the_gate_closes_at_the_renew_deadline_while_the_loop_is_stuck() -> None:
    async def scenario() -> None:
        store = LeaseStore()
        timing = Timing(1, 0.3, 0.1)
        g = LeaseGate(store.client("a"), "ns", "torchflex", "a", timing)
        g.start()
        await asyncio.wait_for(g.wait_active(), 5)
        stuck = Hanging(store, "a")
        g.source = stuck
        for _ in range(100):
            if not g.active:
                break
            await asyncio.sleep(0.05)
        assert not g.active
        stuck.answer.set()
        await g.stop()

    asyncio.run(scenario())


def test_standalone_gate_is_always_open() -> None:
    async def scenario() -> bool:
        g = Gate()
        g.start()
        await asyncio.wait_for(g.wait_active(), 1)
        await g.stop()
        return g.active

    assert asyncio.run(scenario())


def test_kube_refuses_every_write_but_the_leases_once_the_gate_is_closed() -> None:
    class Coordination:
        def replace_namespaced_lease(self, name: str, ns: str, body: Any, **_: Any) -> Any:
            return {"metadata": {"resourceVersion": "2"}, "spec": body["spec"]}

    async def scenario() -> list[str]:
        sent: list[str] = []

        def request(verb: str, *_: str) -> None:  # (verb, and the status code where counted)
            sent.append(verb)

        kube = Kube(ApiClient(), on_request=request)
        kube.coordination = Coordination()  # type: ignore[assignment]
        kube.may_write = lambda: False
        with pytest.raises(NotLeaderError):
            await kube.create_pod({"metadata": {"namespace": "ns", "name": "p"}})
        with pytest.raises(NotLeaderError):
            await kube.delete_pod("ns", "p", "uid", force=False)
        lease = await kube.replace_lease("ns", "torchflex", "1", {"holderIdentity": None})
        assert lease["metadata"]["resourceVersion"] == "2"
        return sent

    assert asyncio.run(scenario()) == ["update"]  # refused writes never left the process


def test_kopfs_handlers_only_watch_so_a_standby_writes_nothing_through_kopf() -> None:
    # kopf runs standalone on every replica. It writes to the API only for change-detecting
    # handlers (progress annotations), daemons/timers, indexes and webhooks, and finalizers
    # for deletion handlers; there are none, only watch-event handlers and lifecycle hooks.
    registry = register(Reconciler(cast(Kube, object()), Settings()))
    assert registry._changing.get_all_handlers() == []
    assert registry._spawning.get_all_handlers() == []
    assert registry._webhooks.get_all_handlers() == []
    assert registry._indexing.get_all_handlers() == []
    watching = {h.id.rsplit(".", 1)[-1] for h in registry._watching.get_all_handlers()}
    assert watching == {"job_event", "pod_event", "service_event", "network_policy_event",
                        "workload_event", "node_event"}  # fmt: skip
    activities = {h.id.rsplit(".", 1)[-1] for h in registry._activities.get_all_handlers()}
    assert activities == {"login", "startup", "cleanup"}
