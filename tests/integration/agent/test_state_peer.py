"""Sharded state through a SIGKILL, a freeze and the restart path: the lost shard from its peer.

Real agents, a real ``torchflex-agent store``, real torch/gloo workers running
``examples/train_sharded.py`` (ZeRO-style: each rank owns a different shard,
``TrainState(..., sharded=True)``) with no checkpoint folder at all: nothing
is ever on disk. The group has a fixed size (``--nnodes 3:3``), so it resumes
only once a replacement joins. Read from the step logs (``step=N ... shard=S
mark=M sum=C``, printed after step N's commit, and ``restored step=N
from=... slot=... shard=S mark=M sum=C``), after each fault: every rank
resumed the same step, at most one behind the last printed step; each holds
exactly its shard of that step (``mark = shard * 1e6 + step``); the lost
member's shard was served from a peer copy (``slot=peer``, or ``peer-prev``
one step back) and equals what the lost member printed for that step; the
survivors loaded theirs from their own agents' folders (``from=local``) and
the replacement got its shard from a survivor.

* SIGKILL of one node (agent and workers): the survivors re-form in place.
* A freeze (SIGSTOP of one node's whole tree, sockets open): the survivors'
  agents declare it lost (liveness), shut its links and keep their workers,
  which re-form in place. Woken (SIGCONT), its agent fences it before anything
  else (SIGKILL of its workers), its copies stay of the round it froze in, and
  it waits as a spare: the full group trains on undisturbed.
* The restart path (``--no-in-place``): after a SIGKILL every survivor's agent
  starts new workers (other PIDs, no ``in place``), which restore from the
  copies their agents kept in ``/dev/shm``.

Network: 127.0.0.1 only; every process is started here and stopped by PID
(the helpers of ``test_state_api.py``).
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import pytest

from e2e.kubelet import records
from e2e.localproc import LineLog
from tests.integration.agent.test_state_api import SHM, last_step_before, signal_tree, training_at
from tests.integration.agent.tfagent_helpers import PYTHON, REPO, Job, pid_alive, preempt
from torchflex_agent.memstate.logic.copies import CopyMeta
from torchflex_agent.memstate.logic.shards import SLOTS
from torchflex_contract.exit_codes import ExitCode

SHARDED = str(REPO / "examples" / "train_sharded.py")
SHARD = r"shard=(\d+) mark=(\d+) sum=(\S+)"
STEP_SHARD = re.compile(r"^\[rank \d+\] step=(\d+) .* " + SHARD)
RESTORED = re.compile(
    r"^\[rank (\d+)\] restored step=(\d+) from=(local|rank \d+) slot=(\S+) "
    + SHARD
    + r" round=\d+( in place)?"
)
# The agent's line for each round it runs workers in: kept (in place) or started.
WORKERS = r"round (\d+): (kept|started) workers .*pids \[([\d, ]*)\]"


@pytest.fixture()
def sjob(tmp_path: Path) -> Iterator[Job]:
    with Job(tmp_path) as j:
        yield j


def start(job: Job, *options: str) -> LineLog:
    # No checkpoint folder: a resume can only come from the agents' memory.
    args = [PYTHON, SHARDED, "--steps", "100000", "--step-time", "0.1", *options]
    return job.start_agent(args, "3:3")


def training_three(job: Job, *options: str) -> list[LineLog]:
    """A store and three agents whose workers all printed step 5 or later."""
    job.start_store()
    logs = [start(job, *options) for _ in range(3)]
    training_at(logs, 3, 0.0, 90, min_step=5)
    return logs


def strike(
    job: Job, logs: Sequence[LineLog], sig: signal.Signals, *options: str
) -> tuple[float, list[LineLog]]:
    """``sig`` to ``logs[1]``'s whole process tree (agent and workers), then a replacement
    that holds nothing: (when, the new group: the survivors, then the replacement)."""
    tree = records.process_tree(logs[1].proc.pid)
    if sig is signal.SIGSTOP:
        job.frozen = tree  # woken before the job's teardown stops it
    at = time.monotonic()
    signal_tree(tree, sig)
    if sig is signal.SIGKILL:
        logs[1].proc.wait(10)
    return at, [*(log for log in logs if log is not logs[1]), start(job, *options)]


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


def workers(log: LineLog, after: float = 0.0) -> tuple[int, str, list[int]]:
    """The agent's newest round with workers (waited for after ``after``): (round,
    kept|started, PIDs). Its line may come a moment after the workers' own."""
    log.wait_for(lambda s: re.search(WORKERS, s) is not None, 10, after=after)
    m = log.matching(WORKERS)[-1][1]
    return int(m.group(1)), m.group(2), [int(p) for p in re.findall(r"\d+", m.group(3))]


class Resume(NamedTuple):
    step: int
    lines: list[re.Match[str]]
    """Each group member's ``restored`` line, in the group's order (the newcomer last)."""


def resumed_with_lost_shard(
    what: str, logs: Sequence[LineLog], lost: LineLog, group: Sequence[LineLog], fault_at: float
) -> Resume:
    """The group's (survivors, then the replacement) first resume after the fault at
    ``fault_at``, held to the promise: one step, at most one lost, exact shards, the lost
    shard from its peer copy equal to what its member printed, the survivors' from their
    own agents' folders, the replacement's from a survivor."""
    timed = restored(group, fault_at, 90)
    got = [m for _, m in timed]
    last = last_step_before(logs, min(t for t, _ in timed))
    steps = {int(m.group(2)) for m in got}
    print(f"\nSHARDED {what}: last printed step {last}, resumed {[m.group(0) for m in got]}")
    print(f"SHARDED {what}: resumed {max(t for t, _ in timed) - fault_at:.2f} s after the fault")
    assert len(steps) == 1, f"the ranks resumed different steps: {got}"
    step = steps.pop()
    assert step <= last + 1, f"resumed step {step}, beyond the last printed {last}"
    # Every rank holds exactly its shard of that step.
    assert sorted(int(m.group(5)) for m in got) == [0, 1, 2]
    assert all(int(m.group(6)) == int(m.group(5)) * 1_000_000 + step for m in got), got
    # Nothing reached a survivor from elsewhere: each loaded a slot of its own agent's
    # folder; the replacement, which holds nothing, got its shard from a survivor.
    assert all(m.group(3) == "local" for m in got[:-1]), got
    assert got[-1].group(3) != "local", got[-1].group(0)

    # The lost member's shard: served from its successor's peer copy, equal to what the
    # lost member printed for that step (when it lived to print it).
    lost_lines = [m for line in lost.texts() if (m := STEP_SHARD.search(line)) is not None]
    lost_shard = int(lost_lines[-1].group(2))
    (theirs,) = [m for m in got if int(m.group(5)) == lost_shard]
    assert theirs.group(4) in ("peer", "peer-prev"), theirs.group(0)
    # Every printed step was committed by every rank; one is lost only when the lost
    # member died before its copy of it reached its peer (then served one step back).
    floor = last - 1 if theirs.group(4) == "peer-prev" else last
    assert step >= floor, f"lost {last - step} steps (from {theirs.group(4)})"
    # The example prints a step right after its commit: the lost member printed it,
    # unless the SIGKILL fell between its commit and its print (a loaded machine: seen
    # in a full run); then it is the step after the last it printed, and its value
    # cannot be compared.
    printed = {int(m.group(1)): m.group(4) for m in lost_lines if int(m.group(2)) == lost_shard}
    assert step in printed or step == max(printed) + 1, (step, sorted(printed)[-3:])
    if step in printed:
        assert theirs.group(7) == printed[step], (theirs.group(0), printed[step])
    return Resume(step, got)


def copy_rounds(log: LineLog) -> dict[str, int]:
    """The round of every state copy in this agent's ``/dev/shm`` folder, by file name."""
    (folder,) = SHM.glob(f"torchflex-state-{log.proc.pid}-*")
    out = {}
    for slot in SLOTS:
        path = folder / f"{slot}-0"
        if path.exists():
            with path.open("rb") as f:
                out[path.name] = CopyMeta.from_header(f.readline()).round
    return out


def preempted_cleanly(agents: Sequence[LineLog]) -> None:
    assert preempt(agents, 60) == [ExitCode.PREEMPTED] * len(agents)
    # Each agent removed its in-memory folder when it exited.
    left = [p.name for log in agents for p in SHM.glob(f"torchflex-state-{log.proc.pid}-*")]
    assert not left, left


@pytest.mark.timeout(150)
def test_lost_shard_comes_back_from_its_peer_copy(sjob: Job) -> None:
    logs = training_three(sjob)
    killed_at, group = strike(sjob, logs, signal.SIGKILL)
    step, got = resumed_with_lost_shard("sigkill", logs, logs[1], group, killed_at)
    # The survivors kept their processes: a new process group, the same workers.
    assert all(m.group(8) for m in got[:-1]), got
    training_at(group, 3, killed_at, 60, min_step=step + 2)
    preempted_cleanly(group)


@pytest.mark.timeout(150)
def test_frozen_members_shard_comes_from_its_peer_and_it_wakes_fenced(sjob: Job) -> None:
    logs = training_three(sjob)
    frozen = logs[1]
    frozen_round, _, frozen_pids = workers(frozen)
    # Freeze one node's whole tree: no socket closes, only its heartbeats stop.
    frozen_at, group = strike(sjob, logs, signal.SIGSTOP)
    assert set(frozen_pids) <= set(sjob.frozen), (frozen_pids, sjob.frozen)

    step, got = resumed_with_lost_shard("freeze", logs, frozen, group, frozen_at)
    # Unblocked (their agents shut the frozen node's links), the survivors re-formed in place.
    assert all(m.group(8) for m in got[:-1]), got
    assert all(workers(log, frozen_at)[1] == "kept" for log in group[:-1])
    training_at(group, 3, frozen_at, 60, min_step=step + 2)

    # Wake it. Its agent fences it first (its lease ran out): its workers are SIGKILLed
    # before they can write; then it asks to join, finds the round full and waits.
    woke_at = time.monotonic()
    signal_tree(sjob.frozen, signal.SIGCONT)
    sjob.frozen = []
    _, fenced = frozen.wait_for(lambda s: "fenced: node rank" in s, 30, after=woke_at)
    print(f"SHARDED woken: {fenced}")
    assert not [pid for pid in frozen_pids if pid_alive(pid, 10)], frozen_pids
    frozen.wait_for(lambda s: "joining the rendezvous" in s, 30, after=woke_at)
    # The group trains on as it was: no re-form, every rank's shard at every step.
    training_at(group, 3, woke_at, 60, min_step=step + 10)
    assert not [
        line for log in group for t, line in log.timed() if woke_at <= t and RESTORED.search(line)
    ]
    for log in group:
        lines = [m for t, line in log.timed() if t >= woke_at if (m := STEP_SHARD.search(line))]
        assert lines, log.name
        assert all(int(m.group(3)) == int(m.group(2)) * 1_000_000 + int(m.group(1)) for m in lines)
    # Nothing it held after the freeze was written: its copies are of the round it froze
    # in, every copy of the group's is of a later round.
    woken, theirs = copy_rounds(frozen), [copy_rounds(log) for log in group]
    print(f"SHARDED woken member's copies {woken}, the group's {theirs}")
    assert set(woken.values()) == {frozen_round}, (frozen_round, woken)
    assert all(r > frozen_round for rounds in theirs for r in rounds.values()), theirs
    assert not [t for t, _ in frozen.matching(WORKERS) if t >= woke_at], "the spare joined"
    preempted_cleanly([*group, frozen])


@pytest.mark.timeout(150)
def test_restarted_workers_restore_shards_from_the_agents_copies(sjob: Job) -> None:
    logs = training_three(sjob, "--no-in-place")
    survivors = [logs[0], logs[2]]
    before = [workers(log) for log in survivors]
    killed_at, group = strike(sjob, logs, signal.SIGKILL, "--no-in-place")
    step, got = resumed_with_lost_shard("restart", logs, logs[1], group, killed_at)
    # The restart path: each survivor's agent started new workers (other processes) for
    # the new round, and none of them says "in place".
    assert not [m.group(0) for m in got if m.group(8)], got
    for log, (old_round, _, old_pids) in zip(survivors, before, strict=True):
        new_round, how, pids = workers(log, killed_at)
        assert (how, new_round > old_round) == ("started", True), (old_round, new_round, how)
        assert not set(pids) & set(old_pids), (old_pids, pids)
    training_at(group, 3, killed_at, 60, min_step=step + 2)
    preempted_cleanly(group)
