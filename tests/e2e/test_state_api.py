"""The state API as an ElasticJob: a SIGKILL and a freeze, at most one step lost each.

Where it sits: e2e tier (issue 18's "done means"). The pods run
``examples/train_stateful.py`` unchanged (in-place on, its default) under the
real operator on the process kubelet; the job has a checkpoint folder, so
the disk path exists, and the scenario shows it is never taken. In order:

1. SIGKILL of one pod's whole process tree (agent and worker): the survivors'
   processes re-create their group in place and resume from their own
   in-memory copies (``from=local ... in place``; reported, not asserted:
   see the kill below); the operator's
   replacement joins and receives the group's state by broadcast
   (``from=rank K``).
2. SIGSTOP of another pod's whole tree (a frozen node: no socket closes):
   the survivors' agents declare it lost, keep their workers and tell them to
   shut their old group's links down (``state_unblock``): the same processes
   re-form in place from their own copies; then it is woken (SIGCONT). Its
   copy is from an older round: if it rejoins, it receives the group's
   state, never uses its own.
3. The job reaches ``Succeeded``. Then every pod's log is read in order
   (each worker's ``step=N`` and ``restored step=N from=... round=R`` lines)
   and checked: each round resumes at most one step behind the highest step
   printed in any earlier round (a fault costs at most the step in flight),
   every rank of a round resumes from the same step, a worker's steps never go
   back by more than that, nothing was read from disk (``resumed from``), and
   the final step was trained.

The recovery figures it prints (``[measured]``) are read from the workers' own
clocks (``TRAIN_PRINT_TIME=1``: `` t=<unix time>`` on each ``step`` and
``restored`` line) against the fault's wall time, with ``benchmarks._proc_logs``
(the process-level benchmark's definitions): not from when this harness's
polling happened to see a line.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

from benchmarks._proc_logs import parse_steps, recovery_seconds, resumed_seconds
from e2e.cluster import Cluster
from e2e.kubelet import faults
from e2e.operator_proc import sigkill_pod_processes, wait_gone
from e2e.trainlog import LogFollower, parse_line
from e2e.workload import TrainingJob, apply
from tests.e2e.checks import current_round, uid_of, wait_phase
from tests.support import wait_for
from torchflex_contract import labels

pytestmark = [pytest.mark.timeout(420), pytest.mark.usefixtures("operator_proc")]

NAME = "stateful"
# Enough steps that both faults and the replacement's join (a new pod importing
# torch) happen mid-run even on a loaded machine; 0.1 s each is the example's pace.
STEPS = 400
_RESTORED = re.compile(r"restored step=(\d+) from=(local|rank \d+) round=\d+( in place)?")
_AGENT_ROUND = re.compile(r"round (\d+): node rank \d+ of \d+, world size \d+")


@dataclasses.dataclass(frozen=True)
class Event:
    """One line of a worker's own story, in the order its pod's log holds them."""

    log: str
    """The pod's log folder (``<ns>_<pod>_<uid>``): a replacement is another folder."""
    kind: str
    """``step``, ``restored`` (from memory) or ``resumed`` (from disk)."""
    step: int
    round: int
    """The worker's round: its pod's first, then the one of its latest ``restored`` line."""
    source: str = ""
    """``local`` or ``rank K`` (``restored`` only)."""
    in_place: bool = False


def pod_events(log: Path) -> list[Event]:
    """A worker pod's events, offline. A kept worker may still print its old round's
    step after its agent logged the new round, so a worker enters a round only at its
    ``restored`` line (whose ``round=`` is its copy's: the round is the agent's latest
    ``round N:`` line, written before it handed the round on)."""
    folder = log.parent.name
    out: list[Event] = []
    agent_round = worker_round = -1
    for raw in log.read_text(errors="replace").splitlines():
        if m := _AGENT_ROUND.search(raw):
            agent_round = int(m[1])
            worker_round = agent_round if worker_round < 0 else worker_round
        elif m := _RESTORED.search(raw):
            worker_round = agent_round
            out.append(Event(folder, "restored", int(m[1]), worker_round, m[2], m[3] is not None))
        elif (line := parse_line(raw, folder, worker_round, 0.0)) and line.kind in (
            "step",
            "resumed",
        ):
            out.append(Event(folder, line.kind, line.step, worker_round))
    return out


def lost_per_round(events: Iterable[Event]) -> dict[int, tuple[int, int]]:
    """For every round that resumed from memory: (highest step printed in any earlier
    round, the step every rank resumed from). Asserts the ranks agree."""
    evs = list(events)
    out: dict[int, tuple[int, int]] = {}
    for rnd in sorted({e.round for e in evs if e.kind == "restored"}):
        resumed = {e.step for e in evs if e.kind == "restored" and e.round == rnd}
        assert len(resumed) == 1, f"round {rnd}: ranks resumed from different steps {resumed}"
        before = [e.step for e in evs if e.kind == "step" and e.round < rnd]
        out[rnd] = (max(before, default=0), resumed.pop())
    return out


def stream_problems(events: list[Event]) -> list[str]:
    """One pod's worker lines: each step follows the one before it (or the step it
    restored) by one, and a restore goes back at most one printed step."""
    problems: list[str] = []
    last: int | None = None
    for e in events:
        if e.kind == "restored":
            if last is not None and e.step < last - 1:
                problems.append(f"{e.log}: restored step {e.step} after printing step {last}")
        elif e.kind == "step" and last is not None and e.step != last + 1:
            problems.append(f"{e.log}: step {e.step} after step {last}")
        last = e.step
    return problems


def _report(what: str, seconds: float | None) -> None:
    print(f"[measured] {what}: " + ("n/a" if seconds is None else f"{seconds:.2f} s"))


def _report_resume(what: str, logs: list[Path], event_wall: float) -> None:
    """From the survivors' own clocks: the fault to every survivor's ``restored`` line
    (training again), and to its first completed step at world 2 (None when they
    resumed at another size)."""
    lines = [log.read_text(errors="replace").splitlines() for log in logs]
    _report(f"{what}: every survivor resumed", resumed_seconds(lines, event_wall))
    stepped = recovery_seconds([parse_steps(x) for x in lines], event_wall, 2)
    _report(f"{what}: every survivor completed a step at world 2", stepped)


def _trainer_logs(cluster: Cluster, namespace: str, *, but: Iterable[str]) -> list[Path]:
    """The namespace's trainer logs but those whose folder (``<ns>_<pod>_<uid>``) holds
    one of ``but`` (a pod's ``_<name>_``, a gone pod's UID)."""
    logs = cluster.layout.pods.glob(f"{namespace}_*/{labels.TRAINER_CONTAINER}.log")
    return [log for log in logs if not any(x in log.parent.name for x in but)]


def _stepped(
    follower: LogFollower, world: int | None, after_round: int, pod: str, *, is_pod: bool
) -> bool:
    """Some worker of ``pod`` (or, with ``is_pod=False``, of any other pod) printed a
    step at ``world`` (None: any) in a round after ``after_round`` (a killed pod's last
    lines, read after the kill, are of its own old round; a replacement's are later)."""
    return any(
        (ln.pod == pod) == is_pod
        and ln.round > after_round
        and (world is None or ln.world == world)
        for ln in follower.lines("step")
    )


def _pods_by_rank(follower: LogFollower, after: float, world: int) -> dict[int, str]:
    return {
        ln.rank: ln.pod for ln in follower.lines("step") if ln.seen > after and ln.world == world
    }


def test_state_api_job_loses_at_most_one_step_per_sigkill_and_freeze(
    cluster: Cluster, namespace: str, follower: LogFollower, ckpt_dir: Path
) -> None:
    t0 = time.monotonic()
    job = TrainingJob(
        NAME, ckpt_dir, min_replicas=2, max_replicas=3, steps=STEPS,
        script="examples/train_stateful.py", extra_env=(("TRAIN_PRINT_TIME", "1"),),
    )  # fmt: skip
    apply(cluster, namespace, job.manifest())
    wait_for(
        lambda: any(ln.step >= 10 and ln.world == 3 for ln in follower.lines("step")),
        240,
        "the group of 3 past step 10",
    )

    # 1. SIGKILL a pod's agent and worker at once (not rank 0's: it writes the checkpoints).
    killed = _pods_by_rank(follower, 0.0, 3)[1]
    killed_uid = uid_of(cluster, namespace, killed)
    round_at_kill = current_round(follower)
    survivors = _trainer_logs(cluster, namespace, but=[f"_{killed}_"])
    kill_wall = time.time()
    pids = sigkill_pod_processes(namespace, killed)
    assert pids and wait_gone(pids), f"{killed}'s processes did not die"
    # At world 2, in place, within a fraction of a second; at world 3 when they sat
    # in their collective until the replacement joined (1 run in 8: the killed
    # worker's close did not reach them), which this scenario only reports (the
    # integration test and benchmarks.recovery hold the in-place path and its time).
    wait_for(
        lambda: _stepped(follower, None, round_at_kill, killed, is_pod=False),
        90,
        "the survivors training again",
    )
    # The replacement (same name, new UID) trains in a group of 3.
    joined = wait_for(
        lambda: _stepped(follower, 3, round_at_kill, killed, is_pod=True),
        180,
        "the replacement training",
    )
    _report_resume("sigkill", survivors, kill_wall)
    newcomer = [
        x for x in _trainer_logs(cluster, namespace, but=[killed_uid]) if x not in survivors
    ]
    replaced = recovery_seconds(
        [parse_steps(x.read_text(errors="replace").splitlines()) for x in newcomer], kill_wall, 3
    )
    _report("sigkill: the replacement completed a step at world size 3", replaced)

    # 2. Freeze another member, again not rank 0 (ranks as the group of 3 prints them).
    wait_for(lambda: len(_pods_by_rank(follower, joined, 3)) == 3, 30, "every rank at world 3")
    frozen_pod = _pods_by_rank(follower, joined, 3)[1]
    frozen_uid = uid_of(cluster, namespace, frozen_pod)
    round_at_freeze = current_round(follower)
    survivors = _trainer_logs(cluster, namespace, but=[f"_{frozen_pod}_", killed_uid])
    freeze_wall = time.time()
    frozen = faults.freeze_pod(cluster.layout.pods, namespace, frozen_pod)
    try:
        wait_for(
            lambda: _stepped(follower, 2, round_at_freeze, frozen_pod, is_pod=False),
            90,
            "survivors at world 2",
        )
    finally:
        faults.thaw(frozen)
    _report_resume("freeze", survivors, freeze_wall)
    wait_phase(cluster, namespace, NAME, "Succeeded", 300)
    _report("whole scenario", time.monotonic() - t0)

    # 3. The pods' own logs, in order.
    by_log = {
        log.parent.name: pod_events(log)
        for log in cluster.layout.pods.glob(f"{namespace}_*/{labels.TRAINER_CONTAINER}.log")
    }
    events = [e for evs in by_log.values() for e in evs]
    assert not [e for e in events if e.kind == "resumed"], "a worker read its disk checkpoint"
    assert max(e.step for e in events if e.kind == "step") == STEPS
    problems = [p for evs in by_log.values() for p in stream_problems(evs)]
    assert not problems, "\n".join(problems)
    per_round = lost_per_round(events)
    print(f"STATE rounds (highest step printed before, resumed from): {per_round}")
    for rnd, (before, resumed) in per_round.items():
        # At most the step in flight is lost; a step every rank completed but none
        # printed yet (the fault struck between its commit and its line) is kept.
        assert before - 1 <= resumed <= before + 1, f"round {rnd}: {before} -> {resumed}"
    # A pod starts either fresh in the job's first training, or from a peer's copy:
    # a newcomer holds nothing of its own.
    for log, evs in by_log.items():
        if evs and evs[0].kind == "restored":
            assert evs[0].source.startswith("rank "), (log, evs[:3])
        elif evs:
            assert evs[0].step == 1, (log, evs[:3])

    for what, at in (("sigkill", round_at_kill), ("freeze", round_at_freeze)):
        rnd = min(e.round for e in events if e.kind == "restored" and e.round > at)
        first = [e for e in events if e.kind == "restored" and e.round == rnd]
        print(f"STATE {what}: (last printed, resumed) {per_round[rnd]}, via {first}")
    # After the freeze: the survivors alone, each from its own copy (nothing sent), in
    # the same processes (unblocked from their collective with the frozen one).
    assert all(e.source == "local" and e.in_place for e in first), first
    # The killed pod's replacement joined, by broadcast (checked above for every newcomer).
    replacement = [
        k for k in by_log if k.startswith(f"{namespace}_{killed}_") and killed_uid not in k
    ]
    assert replacement and by_log[replacement[0]], f"no replacement of {killed} trained"
    # The woken member never resumed from its own (older) copy.
    woken = [
        e
        for log, evs in by_log.items()
        if frozen_uid in log
        for e in evs
        if e.kind == "restored" and e.round > round_at_freeze
    ]
    assert all(e.source.startswith("rank ") for e in woken), woken
