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
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from e2e.localproc import free_port, stop_process
from tests.integration.agent.tfagent_helpers import (
    AGENT_BIN,
    EXAMPLE,
    PYTHON,
    LineLog,
    child_env,
    start_etcd,
    start_store,
)
from torchflex_contract.exit_codes import ExitCode
from torchflex_contract.progress import AgentReport, AgentState

FAILING = str(Path(__file__).with_name("failing_train.py"))
FAIL_ONCE = str(Path(__file__).with_name("fail_once.py"))
FAIL_IN_TURN = str(Path(__file__).with_name("fail_in_turn.py"))
STEP = re.compile(r"^\[rank (\d+)\] step=(\d+) .*world=(\d+)")


class Job:
    """A store process plus N agents sharing one run id; cleans up by PID."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.run_id = f"it-{uuid.uuid4().hex[:8]}"
        self.ckpt = tmp / "ckpt"
        self.store: subprocess.Popen[str] | None = None
        self.etcd: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.backend = "c10d"
        self.agents: list[LineLog] = []

    def start_store(self, port: int = 0) -> None:
        self.store, self.port, _ = start_store(port)

    def start_etcd(self, data_dir: Path, client: int = 0, peer: int = 0) -> int:
        """A real etcd as the rendezvous backend; returns its peer port (to restart in place)."""
        peer = peer or free_port()
        self.etcd, self.port = start_etcd(data_dir, client=client or self.port, peer=peer)
        self.backend = "etcd"
        return peer

    def start_agent(
        self, script_args: list[str], nnodes: str, extra: list[str] | None = None
    ) -> LineLog:
        i = len(self.agents)
        cmd = [
            AGENT_BIN,
            "--nnodes", nnodes,
            "--nproc-per-node", "1",
            "--rdzv-backend", self.backend,
            "--rdzv-endpoint", f"127.0.0.1:{self.port}",
            "--rdzv-id", self.run_id,
            "--rdzv-last-call", "0.5",
            "--rdzv-join-timeout", "60",
            "--health-port", "0",
            "--node-addr", "127.0.0.1",
            "--termination-grace", "15",
            *(extra or []),
            "--",
            *script_args,
        ]  # fmt: skip
        env = child_env({"TORCHFLEX_TERMINATION_LOG": str(self.tmp / f"termination-{i}.log")})
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        log = LineLog(proc, f"agent{i}")
        self.agents.append(log)
        return log

    def train_args(self, steps: int = 400) -> list[str]:
        return [PYTHON, EXAMPLE, "--steps", str(steps), "--step-time", "0.1",
                "--ckpt-dir", str(self.ckpt), "--ckpt-every", "5"]  # fmt: skip

    def termination_report(self, i: int) -> AgentReport:
        return AgentReport.from_json((self.tmp / f"termination-{i}.log").read_text())

    def close(self) -> None:
        for a in self.agents:
            stop_process(a.proc, grace=20)
        if self.store is not None:
            stop_process(self.store)
        if self.etcd is not None:
            stop_process(self.etcd)


@pytest.fixture()
def job(tmp_path: Path) -> Iterator[Job]:
    j = Job(tmp_path)
    try:
        yield j
    finally:
        j.close()


def steps_of(log: LineLog, after: float = 0.0) -> list[tuple[float, int, int]]:
    """(time, step, world) of this agent's step lines."""
    out = []
    for t, m in log.matching(STEP.pattern):
        if t >= after:
            out.append((t, int(m.group(2)), int(m.group(3))))
    return out


def node_rank(log: LineLog) -> int:
    _, line = log.wait_for(lambda s: "node rank" in s, 5)
    m = re.search(r"node rank (\d+)", line)
    assert m
    return int(m.group(1))


def pid_alive(pid: int, wait: float) -> bool:
    """Whether ``pid`` still exists (not a zombie) after up to ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            status = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except OSError:
            return False
        if status == "Z":
            return False
        time.sleep(0.05)
    return True


def checkpoint_step(job: Job) -> int:
    state = torch.load(job.ckpt / "latest.pt", weights_only=True)
    return int(state["step"])


def world_line(world: int) -> re.Pattern[str]:
    return re.compile(rf"step=\d+ .*world={world} ")


@pytest.mark.timeout(150)
def test_sigkill_one_agent_survivors_resume_from_same_step(job: Job) -> None:
    job.start_store()
    logs = [job.start_agent(job.train_args(), "2:3") for _ in range(3)]
    for log in logs:
        log.wait_for(lambda s: bool(re.search(r"step=8 .*world=3 ", s)), 90)
    victim = next(log for log in logs if node_rank(log) != 0)
    survivors = [log for log in logs if log is not victim]
    rank0 = next(log for log in survivors if node_rank(log) == 0)
    victim_pids = [
        int(p)
        for p in re.findall(r"\d+", victim.wait_for(lambda s: "pids" in s, 5)[1].split("pids")[1])
    ]
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
    for log in survivors:
        log.proc.send_signal(signal.SIGTERM)
    for log in survivors:
        assert log.proc.wait(40) == ExitCode.PREEMPTED


@pytest.mark.timeout(150)
def test_sigterm_preempts_with_checkpoint(job: Job) -> None:
    job.start_store()
    logs = [job.start_agent(job.train_args(), "2:2") for _ in range(2)]
    for log in logs:
        log.wait_for(lambda s: "step=7 " in s, 90)
    termed_at = time.monotonic()
    for log in logs:
        log.proc.send_signal(signal.SIGTERM)
    codes = [log.proc.wait(40) for log in logs]
    assert codes == [ExitCode.PREEMPTED] * 2
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
    job.start_store()
    logs = [job.start_agent(job.train_args(), "2:2") for _ in range(2)]
    for log in logs:
        log.wait_for(lambda s: "step=6 " in s, 90)
    assert job.store is not None
    port = job.port
    job.store.send_signal(signal.SIGKILL)
    job.store.wait(10)
    lost_at = time.monotonic()
    time.sleep(1.0)  # the store pod takes a moment to come back
    job.start_store(port)
    for log in logs:
        log.wait_for(lambda s: "StoreLost" in s, 30, after=lost_at)
        log.wait_for(lambda s: "resumed from step=" in s, 60, after=lost_at)
        log.wait_for(lambda s: world_line(2).search(s) is not None, 60, after=lost_at)
    for log in logs:
        assert log.proc.poll() is None
        log.proc.send_signal(signal.SIGTERM)
    for log in logs:
        assert log.proc.wait(40) == ExitCode.PREEMPTED


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
    assert job.etcd is not None
    job.etcd.send_signal(signal.SIGKILL)
    job.etcd.wait(10)
    lost_at = time.monotonic()
    time.sleep(1.0)
    job.start_etcd(data if keep_data else tmp_path / "etcd-fresh", client=job.port, peer=peer)
    for log in logs:
        log.wait_for(lambda s: "StoreLost" in s, 30, after=lost_at)
        log.wait_for(lambda s: "resumed from step=" in s, 60, after=lost_at)
        log.wait_for(lambda s: world_line(2).search(s) is not None, 60, after=lost_at)
    rounds = {int(m.group(1)) for log in logs for t, m in log.matching(r"round (\d+): node rank")
              if t > lost_at}  # fmt: skip
    assert len(rounds) == 1, f"the agents re-formed in different rounds: {rounds}"
    for log in logs:
        assert log.proc.poll() is None
        log.proc.send_signal(signal.SIGTERM)
    for log in logs:
        assert log.proc.wait(40) == ExitCode.PREEMPTED


@pytest.mark.timeout(180)
def test_restart_count_survives_store_restart(job: Job) -> None:
    """The job-wide restart count is republished by the agents after the store lost it."""
    job.start_store()
    logs = [job.start_agent([PYTHON, FAIL_ONCE], "2:2") for _ in range(2)]
    for log in logs:
        log.wait_for(lambda s: "running restart_count=1" in s, 90)
    assert job.store is not None
    port = job.port
    job.store.send_signal(signal.SIGKILL)
    job.store.wait(10)
    lost_at = time.monotonic()
    time.sleep(0.5)
    job.start_store(port)
    for log in logs:
        log.wait_for(lambda s: "StoreLost" in s, 30, after=lost_at)
        # Workers of the re-formed group see the count from before the
        # store restart (1), not a fresh 0 (which would make the script fail).
        log.wait_for(lambda s: "running restart_count=1" in s, 60, after=lost_at)
    for log in logs:
        assert not [m for t, m in log.matching(r"restart_count=0") if t > lost_at]
        assert log.proc.poll() is None
        log.proc.send_signal(signal.SIGTERM)
    for log in logs:
        assert log.proc.wait(40) == ExitCode.PREEMPTED
