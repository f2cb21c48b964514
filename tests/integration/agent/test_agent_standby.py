"""A warm spare's agent waits outside the rendezvous until its standby file changes.

Where it sits: integration test of ``torchflex_agent.loop.standby`` with real
``torchflex-agent`` processes on loopback (issue 18, warm spare pods). The
spare gets ``TORCHFLEX_STANDBY_FILE`` as the operator sets it; the test
rewrites that file the way a kubelet refreshes a downward-API volume (write a
temporary, rename it over the old one). Assertions are on what the agents and
their workers printed, on exit codes and on the termination-log report.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.agent.tfagent_helpers import Job, steps_of
from torchflex_agent.loop.standby import WAITING_MESSAGE
from torchflex_contract import env as tfenv
from torchflex_contract.exit_codes import ExitCode
from torchflex_contract.progress import AgentState

PROMOTED = re.compile(r"promoted after [\d.]+ s in standby: joining")
# Steps the members train at world 2 once the spare's imports are done: had
# it joined, the group would have re-formed within its heartbeat and last call
# (0.2 s + 0.5 s here), well inside these 15 steps of 0.1 s each.
STEPS_WHILE_SPARE_WAITS = 15


def _write_standby(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _step_line(step: str, world: int) -> Callable[[str], bool]:
    """Matches a worker's step line for ``step`` (a pattern) at world size ``world``."""
    rx = re.compile(rf"step={step} .*world={world} ")
    return lambda line: rx.search(line) is not None


def _start_spare(job: Job, standby: Path, nnodes: str) -> int:
    """Agent number of a spare whose env names ``standby``, as the operator sets it."""
    job.agent_env[tfenv.STANDBY_FILE] = str(standby)
    job.start_agent(job.train_args(), nnodes)
    del job.agent_env[tfenv.STANDBY_FILE]
    return len(job.agents) - 1


@pytest.mark.timeout(120)
def test_spare_stays_out_until_promoted_then_joins(job: Job, tmp_path: Path) -> None:
    members = job.train_together(2, "2:3", r"step=2 .*world=2 ", 60)
    standby = tmp_path / "standby"
    _write_standby(standby, "true")
    spare_started = time.monotonic()
    spare = job.agents[_start_spare(job, standby, "2:3")]
    spare.wait_for(lambda s: WAITING_MESSAGE in s, 60)
    # Its fork server's imports are done: from here on a non-spare would join.
    spare.wait_for(lambda s: "worker fork server ready" in s, 60)
    for log in members:
        target = max(step for _, step, _ in steps_of(log)) + STEPS_WHILE_SPARE_WAITS
        log.wait_for(_step_line(str(target), 2), 60)
    for log in members:
        assert not [t for t, _ in log.matching(r"re-forming") if t >= spare_started], log.text()
        assert all(world == 2 for _, _, world in steps_of(log))
    assert not spare.matching(r"joining the rendezvous"), spare.text()
    assert not spare.matching(r"started workers"), spare.text()

    promoted_at = time.monotonic()
    _write_standby(standby, "false")
    seen, _ = spare.wait_for(lambda s: PROMOTED.search(s) is not None, 30)
    spare.wait_for(lambda s: "joining the rendezvous" in s, 30)
    at_3 = [log.wait_for(_step_line(r"\d+", 3), 60)[0] for log in [*members, spare]]
    assert spare.matching(r"started workers \(1 forked warm\)"), spare.text()
    # Indicative only (shared machine): from the file's rewrite.
    print(
        f"\nSTANDBY promoted_seen_s={seen - promoted_at:.2f} "
        f"all_at_world3_s={max(at_3) - promoted_at:.2f}"
    )


@pytest.mark.timeout(60)
def test_sigterm_while_standby_exits_clean_without_workers(job: Job, tmp_path: Path) -> None:
    job.serve_status = True
    job.start_store()
    standby = tmp_path / "standby"
    _write_standby(standby, "true\n")
    spare = job.agents[_start_spare(job, standby, "2:3")]
    spare.wait_for(lambda s: WAITING_MESSAGE in s, 60)
    # Its /status: not a member (no round), saying why, like a pod waiting to join.
    waiting = job.status_when(0, lambda r: r.message == WAITING_MESSAGE, 10)
    assert (waiting.state, waiting.round, waiting.world_size) == (AgentState.INIT, -1, 0)
    spare.proc.send_signal(signal.SIGTERM)
    assert spare.proc.wait(30) == ExitCode.PREEMPTED, spare.text()
    assert not spare.matching(r"joining the rendezvous"), spare.text()
    assert not spare.matching(r"started workers|step=\d+ "), spare.text()
    report = job.termination_report(0)
    assert report.state is AgentState.LEAVING
    assert report.round == -1
