"""What the agent's report says about the training, with real agents and workers.

A worker's uncaught exception reaches the report (type, message, frames, all
bounded, the termination message within Kubernetes' 4096 bytes) whether
the fork server ran the script or it was spawned; a script's reported steps
and the checkpoint helper's saves reach ``/status`` and the final report;
``GET /status?after=R`` returns once the rendezvous re-forms. Processes run
on 127.0.0.1 only and are stopped by PID (``Job``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.agent.tfagent_helpers import PYTHON, Job
from torchflex_contract.exit_codes import ExitCode
from torchflex_contract.progress import (
    LONG_POLL_MAX_S,
    MAX_ERROR_MESSAGE,
    MAX_FRAMES,
    MAX_TERMINATION_MESSAGE,
    AgentReport,
    AgentState,
    long_poll_path,
)

RAISE_DEEP = str(Path(__file__).with_name("raise_deep.py"))
REPORT_PROGRESS = str(Path(__file__).with_name("report_progress.py"))
SLEEPER = "import time\nwhile True:\n    time.sleep(0.1)\n"


@pytest.fixture()
def sjob(tmp_path: Path) -> Iterator[Job]:
    """A ``Job`` whose agents each serve ``/status`` on a port of their own."""
    with Job(tmp_path, serve_status=True) as j:
        yield j


@pytest.mark.timeout(150)
@pytest.mark.parametrize("prewarm", ["auto", "off"], ids=["forked", "spawned"])
def test_uncaught_exception_reaches_the_report(job: Job, prewarm: str) -> None:
    """Forked: the bootstrap's error file. Spawned: the traceback on stderr."""
    job.start_store()
    log = job.start_agent(
        [PYTHON, RAISE_DEEP], "1:1", ["--max-restarts", "0", "--prewarm", prewarm]
    )
    assert log.proc.wait(120) == ExitCode.USER_ERROR, log.text()[-3000:]
    raw = (job.tmp / "termination-0.log").read_text()
    assert len(raw.encode()) <= MAX_TERMINATION_MESSAGE
    report = AgentReport.from_json(raw)
    assert report.state is AgentState.FAILED
    cause = report.root_cause
    assert cause is not None, raw
    assert cause.type == "ValueError"
    assert cause.message.startswith("bad shard in rank 0 (root-9c2e) xxx")
    assert len(cause.message) <= MAX_ERROR_MESSAGE
    assert (cause.rank, cause.exit_code, cause.round) == (0, 1, 0)
    assert 0 < len(cause.frames) <= MAX_FRAMES
    assert all("raise_deep.py:" in f for f in cause.frames)
    assert cause.frames[-1].endswith(" in level")  # the innermost: where it was raised
    # The message that lastFailure shows today names the exception too.
    assert "ValueError: bad shard in rank 0 (root-9c2e)" in report.message


@pytest.mark.timeout(150)
def test_reported_steps_and_checkpoints_reach_the_report(sjob: Job) -> None:
    job = sjob
    job.start_store()
    release = job.tmp / "release"
    steps = 60
    log = job.start_agent([PYTHON, REPORT_PROGRESS, str(steps), str(job.ckpt), str(release)], "1:1")
    log.wait_for(lambda s: f"trained step={steps}" in s, 90)
    live = job.status(0)
    assert live.holds_rank0 and live.state is AgentState.RUNNING
    progress = live.progress
    assert progress is not None, live
    assert 10 <= progress.step <= steps  # the last write may wait for the rate limit
    assert progress.checkpoint_step == 10
    assert progress.steps_per_second > 0
    assert progress.round == live.round and progress.updated > 0
    release.touch()
    assert log.proc.wait(60) == ExitCode.SUCCESS, log.text()[-3000:]
    final = job.termination_report(0).progress
    assert final is not None and final.step == steps  # flushed at the worker's exit


@pytest.mark.timeout(150)
def test_without_reports_there_is_no_progress(sjob: Job) -> None:
    """A script that reports nothing: the report says so (no guessed step)."""
    sjob.start_store()
    sjob.start_agent([PYTHON, "-c", SLEEPER], "1:1")
    report = sjob.status_when(0, lambda r: r.state is AgentState.RUNNING, 90)
    assert report.progress is None and report.holds_rank0


@pytest.mark.timeout(400)
def test_long_poll_returns_when_the_group_reforms(sjob: Job) -> None:
    job = sjob
    job.start_store()
    job.start_agent([PYTHON, "-c", SLEEPER], "1:2")
    first = job.status_when(0, lambda r: r.state is AgentState.RUNNING, 90)
    assert first.world_size == 1
    got: list[AgentReport] = []

    def hold() -> None:
        # Each request is held by the agent until the round moves, or for
        # LONG_POLL_MAX_S; the new member may take longer than one to start.
        for _ in range(6):
            report = job.status(0, long_poll_path(first.round, LONG_POLL_MAX_S), timeout=60)
            if report.round != first.round:
                got.append(report)
                return

    poll = threading.Thread(target=hold, daemon=True)
    poll.start()
    job.start_agent([PYTHON, "-c", SLEEPER], "1:2")  # a scale-up: a second member
    poll.join(6 * 60)
    assert got, "the long poll did not answer"
    assert got[0].round > first.round
    assert got[0].world_size == 2 and got[0].nodes == 2
