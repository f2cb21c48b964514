"""kopf's peering rule as our gate applies it, and the LIST-into-cache merge."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from tests.unit.operator.factories import NOW
from torchflex_contract import labels
from torchflex_operator.cache import OwnedCache
from torchflex_operator.peering import Gate, PeeringGate, decide, peers_of


def entry(priority: int, seen_ago: float, lifetime: int = 10) -> dict[str, Any]:
    seen = NOW - dt.timedelta(seconds=seen_ago)
    return {"priority": priority, "lifetime": lifetime, "lastseen": seen.isoformat()}


@pytest.mark.parametrize(
    ("status", "active", "recheck"),
    [
        (None, False, None),  # no peering object: standby (kopf waits for it too)
        ({}, True, None),
        ({"me": entry(5, 1)}, True, 9),  # alone: recheck when our own keep-alive lapses
        ({"me": entry(5, 1), "other": entry(3, 1)}, True, 9),  # lower peer
        ({"me": entry(5, 1), "other": entry(7, 2)}, False, 8),  # higher peer: until it expires
        ({"me": entry(5, 1), "other": entry(5, 4)}, False, 6),  # same priority: kopf pauses both
        ({"me": entry(5, 1), "other": entry(7, 11)}, True, 9),  # higher but dead
        ({"me": entry(5, 11), "other": entry(3, 1)}, False, None),  # our keep-alive lapsed
        ({"other": entry(7, 0, lifetime=0)}, True, None),  # a peer said goodbye
    ],
)
def test_decide_mirrors_kopf(
    status: dict[str, Any] | None, active: bool, recheck: float | None
) -> None:
    got_active, got_recheck = decide(status, "me", 5, NOW)
    assert got_active is active
    assert got_recheck == (None if recheck is None else pytest.approx(recheck))


def test_peers_of_skips_garbage() -> None:
    peers = peers_of({"a": entry(1, 0), "b": "junk", "c": {"priority": "x"}}, NOW)
    assert [p.identity for p in peers] == ["a"]


class FakePeeringSource:
    """Serves scripted peering states, then blocks like an idle watch."""

    def __init__(self, states: list[Mapping[str, Any] | None]) -> None:
        self.states = states

    async def watch_peering(
        self, namespace: str | None, name: str, seen: Callable[[Mapping[str, Any] | None], None]
    ) -> None:
        for state in self.states:
            seen(state)
            await asyncio.sleep(0.01)
        await asyncio.sleep(3600)


def test_gate_opens_when_the_higher_peer_expires() -> None:
    async def scenario() -> list[bool]:
        now = dt.datetime.now(dt.UTC)
        other = {"priority": 9, "lifetime": 1, "lastseen": now.isoformat()}
        source = FakePeeringSource([{"status": {"other": other}}])
        gate = PeeringGate(source, "p", ["ns"], "me", 1)
        changes: list[bool] = []
        gate.on_change = changes.append
        assert not gate.active
        gate.start()
        await asyncio.sleep(0.2)
        assert not gate.active  # the higher peer is alive
        await asyncio.wait_for(gate.wait_active(), 3)  # its keep-alive expires after 1 s
        await gate.stop()
        return changes

    assert asyncio.run(scenario()) == [True]


def test_standalone_gate_is_always_open() -> None:
    async def scenario() -> bool:
        gate = Gate()
        gate.start()
        await asyncio.wait_for(gate.wait_active(), 1)
        await gate.stop()
        return gate.active

    assert asyncio.run(scenario())


def pod(name: str, uid: str, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": uid,
            "labels": {labels.Label.JOB_NAME: "demo", labels.Label.ROLE: "worker"},
        },
        "status": {"phase": phase},
    }


def test_merge_listed_lets_newer_watch_events_win() -> None:
    cache = OwnedCache()
    key = ("ns", "demo")
    cache.update_pod("ADDED", pod("ghost", "g"))  # deleted while we were not watching
    cache.update_pod("ADDED", pod("kept", "k", "Pending"))
    mark = cache.mark()
    # Between the mark and the LIST's answer the watch says: "kept" runs, "gone" was deleted.
    cache.update_pod("MODIFIED", pod("kept", "k", "Running"))
    cache.update_pod("ADDED", pod("gone", "x"))
    cache.update_pod("DELETED", pod("gone", "x"))
    listed = [pod("kept", "k", "Pending"), pod("gone", "x"), pod("new", "n")]
    cache.merge_listed(key, listed, since=mark)
    views = {p.name: p for p in cache.job_pods(key)}
    assert set(views) == {"kept", "new"}  # ghost dropped, gone stays gone
    assert views["kept"].phase == "Running"  # the newer watch view, not the LIST's
