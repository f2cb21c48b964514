"""Goodput benchmark: a job trains while nodes keep failing — how much of it is training?

Where it sits: ``python -m benchmarks.goodput`` (also run by ``make bench``
through ``benchmarks.__main__``). Process level, loopback only, no cluster:
one job of ``--nodes`` (4) launchers, one CPU/gloo worker each running
``examples/train_elastic.py --print-time`` unchanged (a step every 100 ms, a
checkpoint every 10 steps and on a peer's loss, as the script does it), under
each launcher in turn, in one run:

* ``torchflex``: ``torchflex-agent`` (defaults) with a ``torchflex-agent
  store`` process, the script unchanged;
* ``torchflex-state``: ``torchflex-agent`` (defaults) running
  ``examples/train_stateful.py``, the same training adopting the opt-in state
  API of issue 18 (part 2): each step's state kept in the agent's memory,
  a re-formed group resumes from it instead of the last checkpoint (which it
  still writes every 10 steps, as the unchanged script does);
* ``torchrun-tuned`` / ``torchrun-default``: stock torchrun, c10d rendezvous,
  the settings of ``benchmarks.recovery`` (``_proc_job.TORCHRUN_CONF``).

Each repetition, per launcher: start the job, wait until every node trains
at full size, measure the no-failure step rate for ``--baseline`` seconds
(the *ideal* rate), then play the chaos schedule for ``--duration`` seconds:
every ``--every`` seconds a seeded draw kills (SIGKILL) or freezes (SIGSTOP)
the process tree of one node, and ``--down`` seconds later the slot gets a
replacement (what is left of the old tree is SIGKILLed, a new launcher
joins). The schedule (``benchmarks._chaos``) is computed once per seed and is
the same list for every launcher; slot 0 is never a victim, because under
torchrun it hosts the rendezvous store, whose loss ends a torchrun job for
good (torchflex keeps its store in a process of its own, as the operator
keeps it in a pod of its own, and never loses it here either). Steps come
from the workers' own step lines, a killed node's included; the accounting
(steps completed, lost, progress, time at full and reduced size, stalled) is
``benchmarks._goodput_stats``'s.

Writes its section of ``benchmarks/RESULTS.md`` and
``benchmarks/plots/goodput.png`` (not with ``--quick`` or ``--no-write``);
``--json`` prints one JSON object.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks import _goodput_report as rep
from benchmarks._chaos import FAULTS, KILL, REPLACE, ChaosEvent, chaos_schedule
from benchmarks._goodput_stats import account, job_timeline, progress_curve, step_rate
from benchmarks._proc_job import EXAMPLE, STATEFUL, Flavor, Lines, ProcJob, signal_tree
from benchmarks.cli import Bench, BenchCli, positive_float, positive_int


@dataclasses.dataclass(frozen=True)
class Launcher:
    """A launcher slot of the comparison; ``flavor`` None: not built yet (``why`` says)."""

    name: str
    flavor: str | None
    why: str = ""
    script: str = EXAMPLE


LAUNCHERS = {
    "torchflex": Launcher("torchflex", "torchflex"),
    "torchflex-state": Launcher("torchflex-state", "torchflex", script=STATEFUL),
    "torchrun-tuned": Launcher("torchrun-tuned", "torchrun-tuned"),
    "torchrun-default": Launcher("torchrun-default", "torchrun-default"),
}
_START_TIMEOUT = 180.0
_WARM_STEPS = 5
# A gap between two completions longer than this is a stall, not training:
# 10 steps of the example's 100 ms, room for a loaded machine's slow step.
_STALL_GAP_S = 1.0
_PROTECTED = frozenset({0})
# A step printed just before the window's end is still in a pipe: a short
# wait before reading (later steps are not counted, their stamps are past it).
_SETTLE_S = 0.5


@dataclasses.dataclass(frozen=True)
class Config:
    nodes: int
    duration: float
    every: float
    down: float
    baseline: float
    faults: tuple[str, ...]

    @property
    def nnodes(self) -> str:
        return f"{self.min_nodes}:{self.nodes}"

    @property
    def min_nodes(self) -> int:
        return max(1, self.nodes // 2)

    def schedule(self, seed: int) -> list[ChaosEvent]:
        return chaos_schedule(
            seed, self.duration, self.every, self.down, self.nodes,
            actions=self.faults, protected=_PROTECTED, min_up=self.min_nodes,
        )  # fmt: skip


# (full run, --quick): a full run shows several faults at 4 nodes; a smoke run
# a few seconds of chaos at 2 nodes.
_DEFAULTS = {
    "nodes": (4, 2),
    "duration": (180.0, 10.0),
    "every": (30.0, 3.0),
    "down": (15.0, 2.0),
    "baseline": (10.0, 3.0),
}


def _config(bench: Bench) -> Config:
    a = bench.args
    pick = {k: getattr(a, k) if getattr(a, k) is not None else v[bench.quick]
            for k, v in _DEFAULTS.items()}  # fmt: skip
    return Config(
        nodes=int(pick["nodes"]), duration=float(pick["duration"]), every=float(pick["every"]),
        down=float(pick["down"]), baseline=float(pick["baseline"]), faults=tuple(a.faults),
    )  # fmt: skip


class Chaos:
    """Plays a schedule on a running job: which launcher holds which slot, and the faults."""

    def __init__(self, job: ProcJob, nodes: int) -> None:
        self.job = job
        self.slots: list[Lines] = list(job.nodes[:nodes])
        self.stopped: set[int] = set()  # PIDs of launchers this benchmark killed

    def apply(self, event: ChaosEvent) -> None:
        old = self.slots[event.node]
        if event.action == REPLACE:
            signal_tree(old.proc.pid, signal.SIGKILL)  # a frozen tree, or nothing left
            self.stopped.add(old.proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                old.proc.wait(10)
            self.slots[event.node] = self.job.start_node()
            return
        signal_tree(old.proc.pid, signal.SIGKILL if event.action == KILL else signal.SIGSTOP)
        self.stopped.add(old.proc.pid)

    def play(self, events: Sequence[ChaosEvent], duration: float) -> list[tuple[float, str, int]]:
        """Each event at its time from now; returns when ``duration`` is over."""
        start = time.monotonic()
        applied = []
        for event in events:
            time.sleep(max(0.0, start + event.time - time.monotonic()))
            self.apply(event)
            applied.append((round(time.monotonic() - start, 3), event.action, event.node))
        time.sleep(max(0.0, start + duration - time.monotonic()))
        return applied

    def exits(self) -> list[str]:
        """Launchers that ended by themselves (not by a fault or a replacement)."""
        return [
            f"{n.name} exited with code {n.proc.returncode}"
            for n in self.job.nodes
            if n.proc.poll() is not None and n.proc.pid not in self.stopped
        ]


def run_launcher(
    launcher: Launcher, cfg: Config, seed: int, events: Sequence[ChaosEvent], workdir: Path
) -> rep.Run:
    assert launcher.flavor is not None
    run = rep.Run(launcher.name, seed)
    job = ProcJob(Flavor(launcher.flavor), workdir, nnodes=cfg.nnodes, script=launcher.script)
    try:
        if not job.start_training(cfg.nodes, _WARM_STEPS, _START_TIMEOUT):
            run.problems.append(f"the {cfg.nodes}-node job did not start training")
            return run
        chaos = Chaos(job, cfg.nodes)
        base_start = time.time()
        time.sleep(cfg.baseline)
        start = time.time()
        run.applied = chaos.play(events, cfg.duration)
        end = start + cfg.duration
        time.sleep(_SETTLE_S)  # the last lines of the window reach their readers
        timeline = job_timeline(s for n in job.nodes for s in n.steps())
        run.ideal_rate = step_rate(timeline, base_start, start, cfg.nodes)
        if run.ideal_rate == 0:
            run.problems.append("no step at full size in the baseline")
        run.result = account(
            timeline, start, end,
            full_world=cfg.nodes, ideal_rate=run.ideal_rate, stall_gap=_STALL_GAP_S,
        )  # fmt: skip
        run.curve = progress_curve(timeline, start, end)
        run.problems += chaos.exits()
        return run
    finally:
        job.close()


def _describe(cfg: Config, seeds: Sequence[int]) -> str:
    return f"""The job: {cfg.nodes} nodes (`--nnodes {cfg.nnodes}`), one worker each
(`examples/train_elastic.py --print-time` unchanged: gloo on CPU, a step every 100 ms,
a checkpoint every 10 steps and, by rank 0, on a peer's loss; `torchflex-state` runs
`examples/train_stateful.py`, the same training adopting the state API: every step
kept in the agent's memory, a checkpoint every 10 steps), all on 127.0.0.1. Per
launcher and seed ({", ".join(map(str, seeds))}): start, wait until every node trains at
{cfg.nodes}, measure the no-failure step rate for {cfg.baseline:.0f} s (*ideal* rate), then
{cfg.duration:.0f} s of chaos: every {cfg.every:.0f} s one node's launcher and every process
it spawned is killed (SIGKILL) or frozen (SIGSTOP: no socket closes), drawn from the
seed among {", ".join(cfg.faults)}; {cfg.down:.0f} s later the slot gets a replacement (what
is left of the old tree is SIGKILLed, a new launcher joins). The schedule below is the
same for every launcher. Slot 0 is never a victim: under torchrun it hosts the
rendezvous store, whose loss ends a torchrun job for good (DESIGN.md), so torchrun is
measured in its best case; torchflex's store is a process of its own, never a victim.

Accounting, from the workers' own step lines (`benchmarks/_goodput_stats.py`): *steps
completed* counts every step the job completed in the window, redone ones included;
*steps lost* are steps done and then done again after a restart from a checkpoint
behind them; *progress* = completed - lost (how far the step counter advanced);
*ideal* = ideal rate x window; *goodput* = progress / ideal. Time at *full* / *reduced
size*: seconds in which the job completed steps at {cfg.nodes} / at fewer nodes; *stalled*:
gaps of more than {_STALL_GAP_S:.0f} s without a step (re-forming, or survivors hung on a
frozen peer). torchrun settings as in the recovery benchmark.

Every process of the job shares the machine's cores (see the machine line);
`make bench` runs one benchmark at a time and nothing else should run beside it."""


def main(argv: list[str] | None = None) -> int:
    cli = BenchCli("goodput", __doc__, quick_help="2 nodes, 10 s of chaos, 1 seed",
                   reps_help="seeds per launcher (default 1)")  # fmt: skip
    cli.add_subset("--launchers", tuple(LAUNCHERS))
    cli.add_subset("--faults", FAULTS)
    cli.add_argument("--seed", type=int, default=0, help="first seed (repetition i: seed + i)")
    cli.add_argument("--nodes", type=positive_int, default=None, help="nodes (default 4, quick 2)")
    seconds = {"duration": "chaos window", "every": "time between faults",
               "down": "fault to replacement", "baseline": "no-failure window"}  # fmt: skip
    for flag, what in seconds.items():
        full, quick = _DEFAULTS[flag]
        help_ = f"{what}, seconds (default {full:.0f}, quick {quick:.0f})"
        cli.add_argument(f"--{flag}", type=positive_float, default=None, help=help_)
    bench = cli.parse(argv)
    cfg = _config(bench)
    if cfg.nodes < 2:
        cli.parser.error("--nodes must be at least 2 (slot 0 is never a victim)")
    seeds = [bench.args.seed + i for i in range(bench.reps(1))]
    schedules = {seed: cfg.schedule(seed) for seed in seeds}
    launchers: list[str] = bench.args.launchers
    not_built = {n: LAUNCHERS[n].why for n in launchers if LAUNCHERS[n].flavor is None}
    runs: list[rep.Run] = []
    with tempfile.TemporaryDirectory(prefix="tf-goodput-") as tmp:
        for seed in seeds:
            for name in launchers:
                launcher = LAUNCHERS[name]
                if launcher.flavor is None:
                    print(f"[goodput] {name}: {rep.NOT_BUILT}", file=sys.stderr, flush=True)
                    continue
                run = run_launcher(launcher, cfg, seed, schedules[seed],
                                   Path(tmp) / f"{name}-{seed}")  # fmt: skip
                runs.append(run)
                print(f"[goodput] {name} seed {seed}: {run.as_json()}", file=sys.stderr,
                      flush=True)  # fmt: skip
    result = rep.summary(launchers, not_built, runs, schedules)
    body = f"""{rep.table(launchers, not_built, runs)}

{rep.headline(result)}

![training progress under churn](plots/goodput.png)

The chaos schedule:

{rep.schedule_table(schedules)}

{_describe(cfg, seeds)}"""
    if bench.write:
        rep.plot(runs, schedules[seeds[0]], cfg.duration)
    bench.write_section("goodput", "Goodput under churn (process level)", body)
    bench.show(body, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
