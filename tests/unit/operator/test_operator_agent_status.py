"""The operator's agent-report client: responses, the rank-0 pod, the held long poll.

The last test runs the agent's real health server (``ReportBoard``) on
127.0.0.1 and the operator's real ``StatusPoller`` against it.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from torchflex_agent.loop.health import HealthServer, ReportBoard
from torchflex_contract.progress import AgentReport, AgentState, Progress, RootCause
from torchflex_operator.model.observed import PodView
from torchflex_operator.runtime.agent_status import (
    StatusPoller,
    leader,
    parse_response,
    remember_rounds,
    status_request,
)

REPORT = AgentReport(
    state=AgentState.RUNNING,
    round=3,
    world_size=4,
    holds_rank0=True,
    root_cause=RootCause("ValueError", "boom", ("t.py:1 in main",), rank=2),
    progress=Progress(step=9, steps_per_second=1.5, checkpoint_step=5),
)


def pod(name: str, index: int, *, running: bool = True, ip: str | None = "10.0.0.1") -> PodView:
    return PodView(
        name=name,
        uid=name,
        role="worker",
        index=index,
        phase="Running" if running else "Pending",
        pod_ip=ip,
    )


def test_status_request_and_response() -> None:
    assert status_request("10.1.2.3", "/status?after=3&wait=30") == (
        b"GET /status?after=3&wait=30 HTTP/1.0\r\nHost: 10.1.2.3\r\n\r\n"
    )
    ok = b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + REPORT.to_json().encode()
    assert parse_response(ok) == REPORT
    assert parse_response(b"HTTP/1.0 400 Bad Request\r\n\r\n{}") is None
    assert parse_response(b"HTTP/1.0 200 OK\r\n\r\n{not json") is None
    assert parse_response(b"garbage") is None


def test_leader_is_the_rank_0_agent_of_the_newest_round() -> None:
    pods = [pod("a", 0), pod("b", 1), pod("c", 2), pod("d", 3, running=False)]
    reports = {
        "a": dataclasses.replace(REPORT, round=2, holds_rank0=True),  # an older round
        "b": dataclasses.replace(REPORT, round=3, holds_rank0=True),
        "c": dataclasses.replace(REPORT, round=3, holds_rank0=False, node_rank=1),
        "d": dataclasses.replace(REPORT, round=4, holds_rank0=True),  # not running
    }
    chosen = leader(pods, reports)
    assert chosen is not None and chosen.name == "b"  # pod index is not rank
    older_agent = {"c": AgentReport(state=AgentState.RUNNING, round=3, node_rank=0)}
    chosen = leader(pods, older_agent)
    assert chosen is not None and chosen.name == "c"
    ending = {"b": dataclasses.replace(REPORT, state=AgentState.LEAVING)}
    assert leader(pods, ending) is None
    assert leader([pod("b", 1, ip=None)], reports) is None
    assert leader(pods, {}) is None


def test_each_pod_instance_keeps_the_newest_round_it_reported() -> None:
    """By UID: a replacement with the lost pod's name starts from nothing, a pod
    that fell silent keeps what it said, a pod that is gone is forgotten."""
    a0, b1 = pod("a", 0), pod("b", 1)
    known = remember_rounds({}, [a0, b1], {"a": dataclasses.replace(REPORT, round=2)})
    assert known == {"a": 2}
    # b reports round 4, a falls silent: a keeps round 2
    known = remember_rounds(known, [a0, b1], {"b": dataclasses.replace(REPORT, round=4)})
    assert known == {"a": 2, "b": 4}
    # an older report (a lagging poll) never lowers it; a joining agent (-1) adds nothing
    known = remember_rounds(known, [a0, b1], {"b": dataclasses.replace(REPORT, round=3)})
    assert known["b"] == 4
    a_new = dataclasses.replace(a0, uid="a-replacement")
    known = remember_rounds(known, [a_new, b1], {"a": dataclasses.replace(REPORT, round=-1)})
    assert known == {"b": 4}  # the old a is gone; the new a has reported no round yet
    poller = StatusPoller(enabled=False)
    assert poller.rounds_seen("job", [a_new, b1], {"b": REPORT}) == {"b": 3}


@pytest.mark.timeout(60)
def test_a_held_long_poll_wakes_the_job_when_the_round_moves() -> None:
    board = ReportBoard(dataclasses.replace(REPORT, round=3))
    server = HealthServer("127.0.0.1", 0, board.get, board.wait_round)
    server.start()
    woken: list[object] = []

    async def scenario() -> tuple[AgentReport, AgentReport]:
        changed = asyncio.Event()

        def on_change(key: object) -> None:
            woken.append(key)
            changed.set()

        poller = StatusPoller(
            enabled=True, port=server.port, timeout=5.0, interval=3600.0, on_change=on_change
        )
        pods = [pod("w-0", 0, ip="127.0.0.1")]
        try:
            first = await poller.reports("job", pods)
            assert poller.watching("job")
            cached = await poller.reports("job", pods)  # within the interval: no new poll
            assert cached == first
            await asyncio.to_thread(
                board.replace, lambda r: dataclasses.replace(r, round=4, world_size=8)
            )
            await asyncio.wait_for(changed.wait(), 30)
            # The cache was dropped: the next pass asks the agent again at once.
            return first["w-0"], (await poller.reports("job", pods))["w-0"]
        finally:
            await poller.close()

    try:
        first, after = asyncio.run(scenario())
    finally:
        server.stop()
    assert (first.round, first.world_size) == (3, 4)
    assert (after.round, after.world_size) == (4, 8)
    assert woken == ["job"]


@pytest.mark.timeout(60)
def test_no_wake_from_an_agent_that_does_not_hold_requests() -> None:
    """An agent without long polls answers at once, unchanged: the watch ends
    quietly (no reconcile loop); the regular poll keeps serving the job."""
    server = HealthServer("127.0.0.1", 0, lambda: REPORT)  # no wait: `after` is ignored
    server.start()
    woken: list[object] = []

    async def scenario() -> bool:
        poller = StatusPoller(enabled=True, port=server.port, timeout=5.0, on_change=woken.append)
        try:
            await poller.reports("job", [pod("w-0", 0, ip="127.0.0.1")])
            for _ in range(200):  # bounded: 20 s
                if not poller.watching("job"):
                    return True
                await asyncio.sleep(0.1)
            return False
        finally:
            await poller.close()

    try:
        ended = asyncio.run(scenario())
    finally:
        server.stop()
    assert ended and woken == []


@pytest.mark.timeout(60)
def test_an_agent_that_goes_away_wakes_the_job() -> None:
    board = ReportBoard(REPORT)
    server = HealthServer("127.0.0.1", 0, board.get, board.wait_round)
    server.start()
    woken: list[object] = []

    async def scenario() -> None:
        changed = asyncio.Event()

        def on_change(key: object) -> None:
            woken.append(key)
            changed.set()

        poller = StatusPoller(
            enabled=True, port=server.port, timeout=1.0, watch_wait=2.0, on_change=on_change
        )
        try:
            await poller.reports("job", [pod("w-0", 0, ip="127.0.0.1")])
            await asyncio.to_thread(server.stop)  # the pod is gone: nothing listens
            await asyncio.wait_for(changed.wait(), 30)
        finally:
            await poller.close()

    asyncio.run(scenario())
    assert woken == ["job"]
