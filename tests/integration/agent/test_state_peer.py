"""Sharded state through a SIGKILL: the lost member's shard comes from its peer copy.

Real agents, a real ``torchflex-agent store``, real torch/gloo workers running
``examples/train_sharded.py`` (ZeRO-style: each rank owns a different shard,
``TrainState(..., sharded=True)``) with no checkpoint folder at all: nothing
is ever on disk. The group has a fixed size (``--nnodes 3:3``). One node is
SIGKILLed (agent and workers: its folder in ``/dev/shm`` is of no use to
anyone now); a replacement starts; the group of three resumes. Read from the
step logs (``step=N ... shard=S mark=M sum=C``, printed after step N's
commit, and ``restored step=N from=... slot=... shard=S mark=M sum=C``):
every rank resumed the same step, at most one behind the last printed step;
each holds exactly its shard of that step (``mark = shard * 1e6 + step``);
the lost member's shard was served from a peer copy (``slot=peer``) and
equals what the lost member printed for that step; the survivors re-formed
in place. Network: 127.0.0.1 only;
every process is started here and stopped by PID (the helpers of
``test_state_api.py``).
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from e2e.kubelet import records
from e2e.localproc import LineLog
from tests.integration.agent.test_state_api import SHM, last_step_before, signal_tree, training_at
from tests.integration.agent.tfagent_helpers import PYTHON, REPO, Job, preempt
from torchflex_contract.exit_codes import ExitCode

SHARDED = str(REPO / "examples" / "train_sharded.py")
SHARD = r"shard=(\d+) mark=(\d+) sum=(\S+)"
STEP_SHARD = re.compile(r"^\[rank \d+\] step=(\d+) .* " + SHARD)
RESTORED = re.compile(
    r"^\[rank (\d+)\] restored step=(\d+) from=(local|rank \d+) slot=(\S+) "
    + SHARD
    + r" round=\d+( in place)?"
)


@pytest.fixture()
def sjob(tmp_path: Path) -> Iterator[Job]:
    with Job(tmp_path) as j:
        yield j


def start(job: Job) -> LineLog:
    # No checkpoint folder: a resume can only come from the agents' memory.
    return job.start_agent([PYTHON, SHARDED, "--steps", "100000", "--step-time", "0.1"], "3:3")


def restored(
    logs: Sequence[LineLog], after: float, timeout: float
) -> list[tuple[float, re.Match[str]]]:
    """Each log's first ``restored`` line after ``after``, with its time."""
    out = []
    for log in logs:
        t, line = log.wait_for(lambda s: RESTORED.search(s) is not None, timeout, after=after)
        m = RESTORED.search(line)
        assert m is not None
        out.append((t, m))
    return out


@pytest.mark.timeout(150)
def test_lost_shard_comes_back_from_its_peer_copy(sjob: Job) -> None:
    sjob.start_store()
    logs = [start(sjob) for _ in range(3)]
    training_at(logs, 3, 0.0, 90, min_step=5)

    victim = logs[1]
    survivors = [log for log in logs if log is not victim]
    killed_at = time.monotonic()
    signal_tree(records.process_tree(victim.proc.pid), signal.SIGKILL)
    victim.proc.wait(10)
    newcomer = start(sjob)  # the replacement holds nothing
    group = [*survivors, newcomer]

    timed = restored(group, killed_at, 90)
    got = [m for _, m in timed]
    last = last_step_before(logs, min(t for t, _ in timed))
    steps = {int(m.group(2)) for m in got}
    lines = [m.group(0) for m in got]
    print(f"\nSHARDED sigkill: last printed step {last}, resumed {lines}")
    print(f"SHARDED resumed {max(t for t, _ in timed) - killed_at:.2f} s after the kill")
    assert len(steps) == 1, f"the ranks resumed different steps: {got}"
    step = steps.pop()
    assert step <= last + 1, f"resumed step {step}, beyond the last printed {last}"
    # Every rank holds exactly its shard of that step.
    assert sorted(int(m.group(5)) for m in got) == [0, 1, 2]
    assert all(int(m.group(6)) == int(m.group(5)) * 1_000_000 + step for m in got), got
    # The survivors kept their processes: a new process group, the same workers.
    assert all(m.group(8) for m in got[: len(survivors)]), got

    # The lost member's shard: served from its successor's peer copy, equal to what the
    # lost member printed for that step (when it lived to print it).
    lost = [STEP_SHARD.search(line) for line in victim.texts()]
    lost_lines = [m for m in lost if m is not None]
    lost_shard = int(lost_lines[-1].group(2))
    (theirs,) = [m for m in got if int(m.group(5)) == lost_shard]
    assert theirs.group(4) in ("peer", "peer-prev"), theirs.group(0)
    # Every printed step was committed by every rank; one is lost only when the lost
    # member died before its copy of it reached its peer (then served one step back).
    floor = last - 1 if theirs.group(4) == "peer-prev" else last
    assert step >= floor, f"lost {last - step} steps (from {theirs.group(4)})"
    # The example prints a step right after its commit: the lost member printed it.
    printed = {int(m.group(1)): m.group(4) for m in lost_lines if int(m.group(2)) == lost_shard}
    assert step in printed, (step, sorted(printed)[-3:])
    assert theirs.group(7) == printed[step], (theirs.group(0), printed[step])
    training_at(group, 3, killed_at, 60, min_step=step + 2)
    assert preempt(group, 60) == [ExitCode.PREEMPTED] * len(group)
    left = [p.name for log in group for p in SHM.glob(f"torchflex-state-{log.proc.pid}-*")]
    assert not left, left
