"""The report's new fields: JSON round trip, bounds, termination trimming, long-poll queries."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from torchflex_agent.loop.health import HealthServer, ReportBoard
from torchflex_contract.progress import (
    LONG_POLL_MAX_S,
    MAX_ERROR_MESSAGE,
    MAX_TERMINATION_MESSAGE,
    AgentReport,
    AgentState,
    Progress,
    RankStall,
    RootCause,
    StallReport,
    StatusQuery,
    long_poll_path,
    parse_status_target,
    termination_text,
)

CAUSE = RootCause(
    "ValueError",
    "bad batch",
    ("/w/train.py:40 in <module>", "/w/train.py:12 in main"),
    rank=3,
    exit_code=1,
    round=2,
    timestamp=1.7e9,
)
PROGRESS = Progress(step=120, steps_per_second=9.5, checkpoint_step=100, updated=1.7e9, round=2)


def test_report_round_trip_with_new_fields() -> None:
    report = AgentReport(
        state=AgentState.FAILED, round=2, holds_rank0=True, root_cause=CAUSE, progress=PROGRESS
    )
    assert AgentReport.from_json(report.to_json()) == report
    old = AgentReport.from_json('{"state": "Running"}')  # an older agent's report
    assert (old.holds_rank0, old.root_cause, old.progress) == (False, None, None)


@pytest.mark.parametrize(
    "field",
    [
        {"root_cause": "boom"},
        {"root_cause": {"message": "no type"}},
        {"root_cause": {"type": "E", "frames": "f"}},
        {"progress": [1]},
        {"progress": {"step": "x"}},
        {"progress": {"updated": "inf"}},
    ],
)
def test_malformed_new_fields_are_rejected(field: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="malformed"):
        AgentReport.from_json(json.dumps({"state": "Running", **field}))


def test_parse_bounds_a_huge_root_cause() -> None:
    raw = {"state": "Failed", "root_cause": {"type": "E", "message": "m" * 10**6}}
    report = AgentReport.from_json(json.dumps(raw))
    assert report.root_cause is not None
    assert len(report.root_cause.message) == MAX_ERROR_MESSAGE


def test_termination_text_trims_frames_then_cause_then_message() -> None:
    big = RootCause("E", "c" * 1000, tuple(f"/x/{i}.py:1 in f" + "y" * 180 for i in range(8)))
    report = AgentReport(state=AgentState.FAILED, message="m" * 1500, root_cause=big)
    assert len(report.to_json()) > MAX_TERMINATION_MESSAGE
    trimmed = AgentReport.from_json(termination_text(report))
    assert trimmed.root_cause is not None
    assert trimmed.root_cause.frames == big.frames[-len(trimmed.root_cause.frames) :]
    assert len(trimmed.root_cause.frames) < 8
    assert trimmed.root_cause.message == big.message  # frames gave way first
    assert trimmed.message == report.message
    small = termination_text(report, limit=1200)
    assert len(small) <= 1200
    tiny = AgentReport.from_json(termination_text(report, limit=600))
    assert tiny.root_cause is not None and tiny.root_cause.frames == ()
    assert tiny.root_cause.type == "E" and len(tiny.message) < 1500


STALL = StallReport(
    round=4,
    rank=1,
    pod="p1",
    timeout=20.0,
    ranks=tuple(
        RankStall(rank=r, pod=f"p{r}", steps=39, idle=12.5, waiting=r != 1, stack="s" * 1000)
        for r in (1, 0, 2, 3)
    ),
)


def test_a_stall_round_trips_and_is_bounded_on_parse() -> None:
    report = AgentReport(state=AgentState.RUNNING, round=5, stall=STALL)
    assert AgentReport.from_json(report.to_json()) == report
    raw = json.loads(report.to_json())
    raw["stall"]["ranks"] = [dict(raw["stall"]["ranks"][0], stack="x" * 5000)] * 20
    parsed = AgentReport.from_json(json.dumps(raw)).stall
    assert parsed is not None and len(parsed.ranks) == 8
    assert all(len(r.stack) == 1024 for r in parsed.ranks)


def test_termination_text_drops_a_stalls_stacks_first_then_the_stall() -> None:
    report = AgentReport(AgentState.SUCCEEDED, message="m" * 100, root_cause=CAUSE, stall=STALL)
    trimmed = AgentReport.from_json(termination_text(report))
    assert trimmed.stall is not None and trimmed.stall.rank == 1
    assert [r.rank for r in trimmed.stall.ranks] == [1, 0, 2, 3]
    assert all(r.stack == "" for r in trimmed.stall.ranks)
    assert trimmed.root_cause == CAUSE  # untouched: the stacks gave way first
    tiny = AgentReport.from_json(termination_text(report, limit=500))
    assert tiny.stall is None and tiny.root_cause is not None


@pytest.mark.parametrize(
    ("target", "query"),
    [
        ("/status", StatusQuery()),
        ("/status?x=1", StatusQuery()),
        ("/status?after=3&wait=5", StatusQuery(3, 5.0)),
        ("/status?after=-1", StatusQuery(-1, LONG_POLL_MAX_S)),
        ("/status?after=3&wait=999", StatusQuery(3, LONG_POLL_MAX_S)),
        (long_poll_path(7, 2.5), StatusQuery(7, 2.5)),
        ("/healthz", None),
        ("/statusx", None),
    ],
)
def test_status_targets(target: str, query: StatusQuery | None) -> None:
    assert parse_status_target(target) == query


@pytest.mark.parametrize(
    "target", ["/status?after=x", "/status?after=1&wait=-1", "/status?after=1&wait=nan"]
)
def test_bad_status_queries(target: str) -> None:
    with pytest.raises(ValueError, match="bad status query"):
        parse_status_target(target)


@pytest.mark.timeout(60)
def test_board_wait_returns_on_round_change_or_ending() -> None:
    board = ReportBoard(AgentReport(state=AgentState.RUNNING, round=4))
    assert board.wait_round(3, 30.0).round == 4  # already different: at once
    assert board.wait_round(4, 0.0).round == 4  # nothing changed within the wait
    got: list[AgentReport] = []
    waiter = threading.Thread(target=lambda: got.append(board.wait_round(4, 30.0)))
    waiter.start()
    board.replace(lambda r: AgentReport(state=AgentState.RUNNING, round=4, world_size=2))
    board.replace(lambda r: AgentReport(state=AgentState.RUNNING, round=5, world_size=3))
    waiter.join(40)
    assert got and (got[0].round, got[0].world_size) == (5, 3)
    board.replace(lambda r: AgentReport(state=AgentState.LEAVING, round=5))
    assert board.wait_round(5, 30.0).state is AgentState.LEAVING


@pytest.mark.timeout(60)
def test_health_server_long_poll() -> None:
    board = ReportBoard(AgentReport(state=AgentState.RUNNING, round=1))
    server = HealthServer("127.0.0.1", 0, board.get, board.wait_round)
    server.start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        got: list[AgentReport] = []

        def poll() -> None:
            with urllib.request.urlopen(base + long_poll_path(1, 30), timeout=45) as resp:
                got.append(AgentReport.from_json(resp.read().decode()))

        poller = threading.Thread(target=poll)
        poller.start()
        board.replace(lambda r: AgentReport(state=AgentState.RUNNING, round=2, world_size=4))
        poller.join(50)
        assert got and (got[0].round, got[0].world_size) == (2, 4)
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(base + "/status?after=x", timeout=5)
        assert err.value.code == 400
    finally:
        server.stop()
