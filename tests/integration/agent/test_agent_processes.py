"""End-to-end tests of real ``torchflex-agent`` processes on loopback.

A ``torchflex-agent store`` process is the c10d store; agents run
``examples/train_elastic.py`` (real torch workers, gloo). Assertions are on
what training printed (step lines, checkpoints) and on exit codes and the
termination-log file, not on exit codes alone.
"""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from e2e.localproc import LineLog
from tests.integration.agent.tfagent_helpers import (
    PYTHON,
    Job,
    node_rank,
    pid_alive,
    preempt,
    steps_of,
    worker_pids,
)
from torchflex_contract.exit_codes import ExitCode
from torchflex_contract.progress import AgentState

FAILING = str(Path(__file__).with_name("failing_train.py"))
FAIL_ONCE = str(Path(__file__).with_name("fail_once.py"))
FAIL_IN_TURN = str(Path(__file__).with_name("fail_in_turn.py"))


def checkpoint_step(job: Job) -> int:
    state = torch.load(job.ckpt / "latest.pt", weights_only=True)
    return int(state["step"])


def world_line(world: int) -> re.Pattern[str]:
    return re.compile(rf"step=\d+ .*world={world} ")


def reformed_after(logs: Sequence[LineLog], lost_at: float) -> None:
    """Every agent saw its store go, resumed from the checkpoint and trains at world size 2."""
    for log in logs:
        log.wait_for(lambda s: "StoreLost" in s, 30, after=lost_at)
        log.wait_for(lambda s: "resumed from step=" in s, 60, after=lost_at)
        log.wait_for(lambda s: world_line(2).search(s) is not None, 60, after=lost_at)


@pytest.mark.timeout(150)
def test_sigkill_one_agent_survivors_resume_from_same_step(job: Job) -> None:
    logs = job.train_together(3, "2:3", r"step=8 .*world=3 ", 90)
    victim = next(log for log in logs if node_rank(log) != 0)
    survivors = [log for log in logs if log is not victim]
    rank0 = next(log for log in survivors if node_rank(log) == 0)
    victim_pids = worker_pids(victim)
    killed_at = time.monotonic()
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait(10)
    resumed = []
    for log in survivors:
        t, _ = log.wait_for(lambda s: world_line(2).search(s) is not None, 60, after=killed_at)
        resumed.append(t)
    recovery = max(resumed) - killed_at
    first_after = min(s for t, s, w in steps_of(rank0, killed_at) if w == 2)
    # Every world-3 step line precedes the kill, whenever it was read: taking the last one
    # now (not before the kill) counts the steps a loaded machine trains in between.
    last_before = max(s for _, s, w in steps_of(rank0) if w == 3)
    # Rank 0 saved the last completed step when its peer vanished; training
    # continues from there: at most the step in flight is redone.
    assert last_before <= first_after <= last_before + 2, (last_before, first_after)
    assert "resumed from step=" in rank0.text()
    for log in survivors:
        assert log.proc.poll() is None, "a survivor exited"
        assert "MemberLost" in log.text() or "WorkerFailed" not in log.text()
    # The victim's predecessor saw its presence link close (no heartbeat timeout).
    assert any("presence link closed" in log.text() for log in survivors)
    # Survivors' new workers were forked warm, not spawned cold.
    assert all(log.matching(r"started workers \(1 forked warm\)") for log in survivors)
    detected, _ = rank0.wait_for(lambda s: "re-forming" in s, 1, after=killed_at)
    formed, _ = rank0.wait_for(lambda s: "rendezvous took" in s, 1, after=killed_at)
    # The victim's worker died with it (parent-death signal), no orphan trains on.
    for pid in victim_pids:
        assert not pid_alive(pid, wait=5.0), f"orphaned worker {pid}"
    print(
        f"\nRECOVERY sigkill_to_training_s={recovery:.2f} detected_s={detected - killed_at:.2f} "
        f"reformed_s={formed - killed_at:.2f} resumed_at_step={first_after}"
    )
    # Finish cleanly: preempt the survivors.
    assert preempt(survivors, 40) == [ExitCode.PREEMPTED] * 2


@pytest.mark.timeout(150)
def test_sigterm_preempts_with_checkpoint(job: Job) -> None:
    logs = job.train_together(2, "2:2", "step=7 ", 90)
    termed_at = time.monotonic()
    assert preempt(logs, 40) == [ExitCode.PREEMPTED] * 2
    last_step = max(step for log in logs for _, step, _ in steps_of(log))
    # The workers finished the step in flight and saved it: nothing lost.
    assert checkpoint_step(job) == last_step
    assert any(f"stopping at step={last_step} on SIGTERM" in log.text() for log in logs)
    for i in range(2):
        report = job.termination_report(i)
        assert report.state is AgentState.LEAVING
    print(f"\nPREEMPT exit_s={time.monotonic() - termed_at:.2f} steps_lost=0")


@pytest.mark.timeout(150)
def test_store_restart_agents_reform(job: Job) -> None:
    logs = job.train_together(2, "2:2", "step=6 ", 90)
    lost_at = job.kill_store()
    time.sleep(1.0)  # the store pod takes a moment to come back
    job.start_store(job.port)
    reformed_after(logs, lost_at)
    assert all(log.proc.poll() is None for log in logs)
    assert preempt(logs, 40) == [ExitCode.PREEMPTED] * 2


@pytest.mark.timeout(150)
def test_failing_script_restarts_then_user_error(job: Job) -> None:
    job.start_store()
    logs = [
        job.start_agent([PYTHON, FAILING], "2:2", extra=["--max-restarts", "2"]) for _ in range(2)
    ]
    codes = [log.proc.wait(120) for log in logs]
    assert codes == [ExitCode.USER_ERROR] * 2, [log.text()[-3000:] for log in logs]
    # One initial attempt plus two restarts, counted per job (not per agent).
    attempts = sorted(
        {int(m.group(1)) for log in logs for _, m in log.matching(r"restart_count=(\d+)")}
    )
    assert attempts == [0, 1, 2]
    for i in range(2):
        report = job.termination_report(i)
        assert report.state is AgentState.FAILED
        assert "boom-7f3a" in report.message
        assert "ValueError" in report.message or "deliberate failure" in report.message
    assert any("boom-7f3a" in log.text() for log in logs)
    json.loads((job.tmp / "termination-0.log").read_text())


@pytest.mark.timeout(150)
def test_max_restarts_is_one_budget_for_the_whole_job(job: Job) -> None:
    """Two nodes fail in turn (attempt 0 on one, 1 on the other, 2 on the first):
    with --max-restarts 2 the third failure ends the job. A per-agent budget
    would have let each node fail twice (attempts 0 to 4)."""
    job.start_store()
    logs = [
        job.start_agent(
            ["env", f"FAIL_TURN={turn}", PYTHON, FAIL_IN_TURN], "2:2", ["--max-restarts", "2"]
        )
        for turn in (0, 1)
    ]
    codes = [log.proc.wait(120) for log in logs]
    assert codes == [ExitCode.USER_ERROR] * 2, [log.text()[-3000:] for log in logs]
    failed_attempts = [
        sorted(int(m.group(1)) for _, m in log.matching(r"failing restart_count=(\d+)"))
        for log in logs
    ]
    assert failed_attempts == [[0, 2], [1]], [log.text()[-3000:] for log in logs]
    assert "after 2 restarts (max 2)" in job.termination_report(0).message


@pytest.mark.timeout(180)
@pytest.mark.parametrize("keep_data", [True, False], ids=["etcd-restart", "etcd-replaced-empty"])
def test_etcd_restart_agents_reform(job: Job, tmp_path: Path, keep_data: bool) -> None:
    """etcd goes away mid-job and comes back on the same address.

    With its data (a restarted member): the closed round is still there and
    its members must end it, not wait on it as if it were someone else's.
    Empty (a replaced, non-persistent etcd pod): everything starts over.
    """
    data = tmp_path / "etcd-data"
    peer = job.start_etcd(data)
    logs = [job.start_agent(job.train_args(), "2:2") for _ in range(2)]
    for log in logs:
        log.wait_for(lambda s: "step=6 " in s, 90)
    lost_at = job.kill_store()
    time.sleep(1.0)
    job.start_etcd(data if keep_data else tmp_path / "etcd-fresh", client=job.port, peer=peer)
    reformed_after(logs, lost_at)
    rounds = {int(m.group(1)) for log in logs for t, m in log.matching(r"round (\d+): node rank")
              if t > lost_at}  # fmt: skip
    assert len(rounds) == 1, f"the agents re-formed in different rounds: {rounds}"
    assert all(log.proc.poll() is None for log in logs)
    assert preempt(logs, 40) == [ExitCode.PREEMPTED] * 2


@pytest.mark.timeout(180)
def test_restart_count_survives_store_restart(job: Job) -> None:
    """The job-wide restart count is republished by the agents after the store lost it."""
    job.start_store()
    logs = [job.start_agent([PYTHON, FAIL_ONCE], "2:2") for _ in range(2)]
    for log in logs:
        log.wait_for(lambda s: "running restart_count=1" in s, 90)
    lost_at = job.kill_store()
    time.sleep(0.5)
    job.start_store(job.port)
    for log in logs:
        log.wait_for(lambda s: "StoreLost" in s, 30, after=lost_at)
        # Workers of the re-formed group see the count from before the
        # store restart (1), not a fresh 0 (which would make the script fail).
        log.wait_for(lambda s: "running restart_count=1" in s, 60, after=lost_at)
    for log in logs:
        assert not [m for t, m in log.matching(r"restart_count=0") if t > lost_at]
        assert log.proc.poll() is None
    assert preempt(logs, 40) == [ExitCode.PREEMPTED] * 2
