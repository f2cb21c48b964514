"""Silent faults with real agents, real torch workers and real signals (issue 11).

A frozen member (SIGSTOP of its agent and every process below it) must
never write a checkpoint after the survivors re-formed, and its workers
must be dead once it wakes; a frozen c10d store must be noticed within
the per-operation deadline, reported in ``/status``, and training must
resume once it wakes; a rank 0 that saves its final model after the
others exited 0 must be supervised to the end. Network: 127.0.0.1 only;
every process is started here and stopped by PID.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.kubelet import records
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
from tests.support import wait_for
from torchflex_agent.checkpoint import CheckpointMeta
from torchflex_contract.exit_codes import ExitCode

FINAL_SAVE = str(Path(__file__).with_name("final_save.py"))
CKPT_LINE = re.compile(r"^\[rank (\d+)\] checkpoint step=(\d+)")


@pytest.fixture()
def fjob(tmp_path: Path) -> Iterator[Job]:
    """Agents with a pod name and a ``/status`` each; what a test froze is woken at teardown."""
    final = {"FINAL_PATH": str(tmp_path / "final-model")}
    with Job(tmp_path, serve_status=True, pod_names=True, agent_env=final) as j:
        yield j


def signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def ckpt_lines(log: LineLog, after: float) -> list[int]:
    return [int(m.group(2)) for t, m in log.matching(CKPT_LINE.pattern) if t >= after]


@pytest.mark.timeout(240)
def test_frozen_member_is_fenced_and_never_writes(fjob: Job) -> None:
    logs = fjob.train_together(3, "2:3", r"step=8 .*world=3 ", 120, steps=3000)
    # Freeze node rank 0: its worker is global rank 0, the one that saves.
    victim = next(log for log in logs if node_rank(log) == 0)
    survivors = [log for log in logs if log is not victim]
    victim_workers = worker_pids(victim)
    fjob.frozen = records.process_tree(victim.proc.pid)
    signal_all(fjob.frozen, signal.SIGSTOP)
    frozen_at = time.monotonic()
    frozen_step = max(step for _, step, _ in steps_of(victim))
    # The survivors re-form at world size 2 and checkpoint beyond the frozen step.
    for log in survivors:
        log.wait_for(lambda s: bool(re.search(r"step=\d+ .*world=2 ", s)), 60, after=frozen_at)
    detected, _ = survivors[0].wait_for(lambda s: "re-forming" in s, 5, after=frozen_at)
    wait_for(
        lambda: any(s > frozen_step for log in survivors for s in ckpt_lines(log, frozen_at)),
        60,
        "a survivor checkpoint past the frozen step",
        interval_s=0.1,
    )
    statuses = [fjob.status(logs.index(log)) for log in survivors]
    assert any(st.lost_pods == (f"pod-{logs.index(victim)}",) for st in statuses), statuses
    # Only the frozen member was ever said to have stopped heartbeating (its
    # predecessor's verdict), never a live survivor that moved on to the next round.
    verdicts = [int(m.group(1)) for log in survivors
                for _, m in log.matching(r"node rank (\d+) stopped heartbeating")]  # fmt: skip
    assert verdicts == [0], verdicts
    before_wake = fjob.ckpt_meta()
    woke_at = time.monotonic()
    signal_all(fjob.frozen, signal.SIGCONT)
    fjob.frozen = []
    victim.wait_for(lambda s: "fenced" in s, 30, after=woke_at)
    for pid in victim_workers:
        assert not pid_alive(pid, wait=10.0), f"frozen member's worker {pid} still alive"
    # Let the woken member rejoin and the group train on; nothing it wrote may
    # have gone behind what the live group had written.
    for log in logs:
        log.wait_for(lambda s: bool(re.search(r"step=\d+ .*world=3 ", s)), 90, after=woke_at)
    after = fjob.ckpt_meta()
    assert (after.round, after.step) >= (before_wake.round, before_wake.step), (before_wake, after)
    woken_saves = [
        t for t, m in victim.matching(CKPT_LINE.pattern)
        if woke_at <= t and int(m.group(2)) <= before_wake.step
    ]  # fmt: skip
    assert not woken_saves, "the woken member wrote a checkpoint behind the live group"
    woken = [
        line for t, line in victim.lines if t >= woke_at and re.search(r"fenced|refused", line)
    ]
    print(
        f"\nFROZEN woken member: {woken[:4]}"
        f"\nFROZEN detected_s={detected - frozen_at:.2f} frozen_step={frozen_step} "
        f"ckpt_before_wake={before_wake} ckpt_after={after}"
    )
    assert preempt(logs, 60) == [ExitCode.PREEMPTED] * len(logs)


@pytest.mark.timeout(240)
def test_workers_of_a_frozen_agent_fence_themselves(fjob: Job) -> None:
    """Only the agent freezes: its workers run on, and must stop writing by themselves."""
    logs = fjob.train_together(3, "2:3", r"step=8 .*world=3 ", 120, steps=3000)
    victim = next(log for log in logs if node_rank(log) == 0)  # hosts global rank 0
    survivors = [log for log in logs if log is not victim]
    landed: list[CheckpointMeta] = []
    fjob.frozen = [victim.proc.pid]
    os.kill(victim.proc.pid, signal.SIGSTOP)
    frozen_at = time.monotonic()
    for log in survivors:
        log.wait_for(lambda s: bool(re.search(r"step=\d+ .*world=2 ", s)), 60, after=frozen_at)

    def new_checkpoint() -> bool:
        meta = fjob.ckpt_meta()
        if not landed or meta != landed[-1]:
            landed.append(meta)
        return any(m.round > 0 for m in landed)

    wait_for(new_checkpoint, 60, "a checkpoint of the re-formed group", interval_s=0.1)
    woke_at = time.monotonic()
    os.kill(victim.proc.pid, signal.SIGCONT)
    fjob.frozen = []
    victim.wait_for(lambda s: "fenced" in s, 30, after=woke_at)
    # Its worker (rank 0 of round 0) tried to save when its peers vanished, after
    # its lease had run out: refused by the worker itself, not by its agent.
    _, refused = victim.wait_for(lambda s: "save refused" in s, 30)
    assert "[rank 0]" in refused
    # The helper's own warning goes to stderr, the script's line to stdout: the two pipes
    # are read apart, so the warning may arrive after the line that follows it.
    victim.wait_for(
        lambda s: bool(
            re.search(r"save of step \d+ refused: fenced \((expired|revoked|other-round)\)", s)
        ),
        10,
    )
    for log in logs:
        log.wait_for(lambda s: bool(re.search(r"step=\d+ .*world=3 ", s)), 90, after=woke_at)
    new_checkpoint()
    keys = [(m.round, m.step) for m in landed]
    assert keys == sorted(keys), keys
    print(f"\nFROZEN_AGENT refused: {refused!r}; checkpoints seen: {keys}")
    assert preempt(logs, 60) == [ExitCode.PREEMPTED] * len(logs)


@pytest.mark.timeout(240)
def test_frozen_store_detected_reported_and_training_resumes(fjob: Job) -> None:
    logs = fjob.train_together(2, "2:2", "step=6 ", 120, steps=3000)
    assert fjob.store is not None
    fjob.frozen = [fjob.store.pid]
    os.kill(fjob.store.pid, signal.SIGSTOP)
    frozen_at = time.monotonic()
    seen = wait_for(
        lambda: all(fjob.status(i).store_error for i in range(2)),
        30,
        "store_error in /status",
        interval_s=0.1,
    )
    report = fjob.status(0)
    assert "silent" in report.store_error or "store" in report.store_error, report
    for log in logs:
        log.wait_for(lambda s: "store lost" in s, 5, after=frozen_at)
    woke_at = time.monotonic()
    os.kill(fjob.store.pid, signal.SIGCONT)
    fjob.frozen = []
    # Training resumes as after a dead store: a new round, steps again.
    for log in logs:
        log.wait_for(lambda s: "StoreLost; re-forming" in s, 60, after=frozen_at)
        log.wait_for(lambda s: bool(re.search(r"step=\d+ .*world=2 ", s)), 90, after=woke_at)
    wait_for(
        lambda: not any(fjob.status(i).store_error for i in range(2)),
        30,
        "store_error cleared",
        interval_s=0.1,
    )
    print(f"\nSTORE_FROZEN detected_s={seen - frozen_at:.2f} (op deadline 2 s)")
    assert preempt(logs, 60) == [ExitCode.PREEMPTED] * len(logs)


@pytest.mark.timeout(180)
def test_rank0_saving_after_others_exit_is_supervised_to_the_end(fjob: Job) -> None:
    fjob.start_store()
    logs = [fjob.start_agent([PYTHON, FINAL_SAVE], "3:3") for _ in range(3)]
    codes = [log.proc.wait(150) for log in logs]
    final = fjob.tmp / "final-model"
    assert codes == [ExitCode.SUCCESS] * 3, [log.text()[-2000:] for log in logs]
    assert final.read_text() == "model\n"
    rank0 = next(log for log in logs if "final model saved" in log.text())
    others = [log for log in logs if log is not rank0]
    saved_at, _ = rank0.wait_for(lambda s: "final model saved" in s, 1)
    # The others were done seconds before rank 0 saved; nobody called them lost.
    for log in others:
        done_at, _ = log.wait_for(lambda s: "done, exiting 0" in s, 1)
        assert done_at < saved_at
    for log in logs:
        assert "MemberLost" not in log.text(), log.text()[-2000:]
        assert "stopped heartbeating" not in log.text()
    reports = [fjob.termination_report(i) for i in range(3)]
    assert all(r.state.value == "Succeeded" for r in reports), reports
    assert json.loads((fjob.tmp / "termination-0.log").read_text())["lost_pods"] == []
