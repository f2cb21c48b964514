"""Workers that finished their work but not their process (issue 26), for real.

Two agents train ``hang_at_end.py`` on a real c10d store; one rank hangs at
the end (a native block in an ``atexit`` handler, or a stuck script). The
agent must end it within its graces, record its stacks (faulthandler) in its
report, and exit with the documented outcome: 0 for a teardown hang (the
work was done), 1 for a completion hang (the script never returned).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.integration.agent.tfagent_helpers import PYTHON, Job
from torchflex_contract.progress import AgentReport, HangKind

SCRIPT = str(Path(__file__).with_name("hang_at_end.py"))
GRACES = ["--teardown-grace", "2", "--completion-grace", "6", "--heartbeat-interval", "0.2"]


def run_pair(tmp_path: Path, hang_at: str, graces: list[str] = GRACES) -> tuple[Job, list[int]]:
    job = Job(tmp_path, agent_env={"HANG_RANK": "1", "HANG_AT": hang_at})
    job.start_store()
    for _ in range(2):
        job.start_agent([PYTHON, SCRIPT], "2:2", graces)
    codes = [a.proc.wait(90) for a in job.agents]
    return job, codes


def hung_report(job: Job) -> tuple[int, AgentReport]:
    """(agent index, its report) of the agent whose report names a hang."""
    reports = [job.termination_report(i) for i in range(len(job.agents))]
    hung = [(i, r) for i, r in enumerate(reports) if r.hang is not None]
    assert len(hung) == 1, f"expected one agent to report a hang: {reports}"
    return hung[0]


@pytest.mark.timeout(180)
def test_teardown_hang_is_ended_with_its_stack_and_the_job_succeeds(tmp_path: Path) -> None:
    job, codes = run_pair(tmp_path, "exit")
    with job:
        assert codes == [0, 0], [a.text() for a in job.agents]
        i, report = hung_report(job)
        hang = report.hang
        assert hang is not None
        assert hang.kind is HangKind.TEARDOWN
        assert hang.rank == 1
        assert 2.0 <= hang.seconds < 30.0
        # faulthandler's dump of the blocked worker: its atexit handler's frame.
        assert "hang_forever_in_teardown" in hang.stack, hang.stack
        log = job.agents[i].text()
        assert "hung in teardown" in log and "pause()" in log


@pytest.mark.timeout(180)
def test_hang_inside_destroy_process_group_is_ended_at_the_teardown_grace(
    tmp_path: Path,
) -> None:
    """Not returned yet, but its stack shows it tearing down: ended after the short
    grace (sampled every teardown grace once a peer finished), not the long one."""
    graces = ["--teardown-grace", "2", "--completion-grace", "120"]
    job, codes = run_pair(tmp_path, "destroy", graces)
    with job:
        assert codes == [0, 0], [a.text() for a in job.agents]
        _i, report = hung_report(job)
        hang = report.hang
        assert hang is not None
        assert hang.kind is HangKind.TEARDOWN and hang.rank == 1
        assert 2.0 <= hang.seconds < 60.0, hang
        assert "destroy_process_group" in hang.stack, hang.stack


@pytest.mark.timeout(180)
def test_completion_hang_is_ended_with_its_stack_and_the_member_fails(tmp_path: Path) -> None:
    job, codes = run_pair(tmp_path, "script")
    with job:
        i, report = hung_report(job)
        assert codes[i] == 1 and codes[1 - i] == 0, codes
        hang = report.hang
        assert hang is not None
        assert hang.kind is HangKind.COMPLETION
        assert hang.rank == 1
        assert hang.seconds >= 6.0
        assert "stuck_in_script" in hang.stack, hang.stack
        assert "still running after the job completed" in report.message
        assert "still running" in job.agents[i].text()


@pytest.fixture(autouse=True)
def _no_py_spy(monkeypatch: pytest.MonkeyPatch) -> None:
    """faulthandler alone must carry the stack (py-spy is optional in images)."""
    monkeypatch.setenv(
        "PATH",
        os.pathsep.join(
            p for p in os.environ["PATH"].split(os.pathsep) if not Path(p, "py-spy").exists()
        ),
    )
