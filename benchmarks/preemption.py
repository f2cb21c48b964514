"""Preemption benchmark: a node gets SIGTERM mid-training — how much work is lost?

Where it sits: ``python -m benchmarks.preemption`` (also run by ``make
bench``). Process level, loopback only, the same 3-node job as
``benchmarks.recovery`` (``--nnodes 2:3``, one gloo worker per node running
``examples/train_elastic.py --print-time``, a step every 100 ms, a
checkpoint every 10 steps). Each repetition SIGTERMs one node's launcher,
as the kubelet does to a pod's main process on preemption or scale-down,
and measures:

* steps lost = the last step the old group completed minus the step the
  re-formed group resumed from (``resumed from step=N``);
* re-form time = from the SIGTERM to the first completed step of the group
  of 2 on every survivor.

Cases: the example's checkpoint hook on (SIGTERM: finish the step, save,
exit; the stop flag is all-reduced so every rank stops at the same step)
and off (``--no-sigterm-hook``: SIGTERM kills the worker; only periodic
checkpoints and the save-on-peer-error path remain). Reference: stock
torchrun (tuned settings, see ``benchmarks.recovery``) with the same two
cases. Writes its section of ``benchmarks/RESULTS.md`` (not with
``--quick``); ``--json`` prints one JSON object.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._proc_job import Flavor, ProcJob
from benchmarks._proc_logs import (
    parse_steps,
    recovery_seconds,
    resumed_steps,
    steps_lost,
)
from benchmarks.cli import BenchCli
from benchmarks.report import markdown_table, summarize
from e2e.polling import poll_until

CASES = ("torchflex", "torchflex-nohook", "torchrun-tuned", "torchrun-tuned-nohook")
_START_TIMEOUT = 120.0
_REFORM_TIMEOUT = 60.0
_WARM_STEPS = 12  # past the first periodic checkpoint (every 10 steps)
# What a survivor's worker prints when it stopped with the leaver (hook on).
_STOPPED_TOO = "stopping at step="


@dataclasses.dataclass
class Trial:
    case: str
    steps_lost: int | None = None
    reform_s: float | None = None
    problem: str | None = None


def _flavor(case: str) -> Flavor:
    return Flavor(case.removesuffix("-nohook"))


def run_trial(case: str, workdir: Path) -> Trial:
    trial = Trial(case)
    flavor = _flavor(case)
    job = ProcJob(flavor, workdir, sigterm_hook=not case.endswith("-nohook"))
    try:
        if not job.start_training(3, _WARM_STEPS, _START_TIMEOUT):
            trial.problem = "the 3-node job did not start training"
            return trial
        victim, survivors = job.victim()
        termed_at = time.time()
        victim.proc.send_signal(signal.SIGTERM)  # the launcher only, as the kubelet does

        def settled() -> bool:
            both = all(any(s.world == 2 and s.t > termed_at for s in n.steps()) for n in survivors)
            gone = all(n.proc.poll() is not None for n in survivors)
            return both or gone

        poll_until(settled, _REFORM_TIMEOUT, 0.1)
        trial.reform_s = recovery_seconds([n.steps() for n in survivors], termed_at, 2)
        if trial.reform_s is None:
            exited = [n.proc.poll() for n in survivors if n.proc.poll() is not None]
            trial.problem = (
                f"survivors exited (codes {exited}) instead of re-forming"
                if exited
                else f"no re-formed group within {_REFORM_TIMEOUT:.0f} s"
            )
            if flavor.is_torchrun and all(
                any(_STOPPED_TOO in line for line in n.texts()) for n in survivors
            ):
                trial.problem += (
                    "; the survivors' workers stopped cleanly with the leaver, which"
                    " torchrun takes for the job's success (its agents then wait in the"
                    " exit barrier)"
                )
            return trial
        old = [s for n in job.nodes for s in n.steps() if s.world == 3]
        last_done = max(s.step for s in old)
        resumed = [
            r
            for n in survivors
            for r in resumed_steps(line for t, line in n.timed() if t > termed_at)
        ]
        first_new = min(s.step for n in survivors for s in parse_steps(n.texts()) if s.world == 2)
        resumed_from = min(resumed) if resumed else first_new - 1
        trial.steps_lost = steps_lost(last_done, resumed_from)
        return trial
    finally:
        job.close()


def summary(trials: list[Trial]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for case in CASES:
        mine = [t for t in trials if t.case == case]
        key = case.replace("-", "_")
        lost = [float(t.steps_lost) for t in mine if t.steps_lost is not None]
        reform = [t.reform_s for t in mine if t.reform_s is not None]
        out[f"{key}_steps_lost"] = summarize(lost).median if lost else None
        out[f"{key}_steps_lost_max"] = max(lost) if lost else None
        out[f"{key}_reform_s"] = summarize(reform).median if reform else None
        out[f"{key}_runs"] = [dataclasses.asdict(t) for t in mine]
    return out


def markdown(trials: list[Trial]) -> str:
    rows = []
    for case in CASES:
        mine = [t for t in trials if t.case == case]
        if not mine:
            continue
        lost = [float(t.steps_lost) for t in mine if t.steps_lost is not None]
        reform = [t.reform_s for t in mine if t.reform_s is not None]
        problems = sorted({t.problem for t in mine if t.problem})
        rows.append(
            [
                case,
                summarize(lost).fmt("steps", 0),
                summarize(reform).fmt("s"),
                f"{len(mine) - len(lost)} of {len(mine)}"
                + (f": {problems[0]}" if problems else ""),
            ]
        )
    table = markdown_table(
        ["launcher / case", "steps lost", "SIGTERM → group of 2 trains", "did not re-form"], rows
    )
    return f"""{table}

Target: 0 steps lost with the example's checkpoint hook.

The job: 3 nodes (`--nnodes 2:3`), one worker each (`examples/train_elastic.py
--print-time`, gloo on CPU, a step every 100 ms, checkpoint every 10 steps), all on
127.0.0.1. Each run sends SIGTERM to one node's launcher process only (what the
kubelet does to a pod's main process), never to the node holding worker rank 0 or
torchrun's store. *Steps lost*: the last step the 3-node group completed minus the
step the 2-node group resumed from. *nohook* runs the example with
`--no-sigterm-hook` (SIGTERM kills the worker: only the periodic checkpoint and
rank 0's save-on-peer-error remain). torchrun: same settings as the recovery
benchmark's *tuned* (see there). A torchrun run that "did not re-form" is one where
the survivors ended instead: with the hook every rank stops cleanly at the same
step, so torchrun's survivors see their workers succeed and finish the job.

Every process of the job shares the machine's cores (see the machine line);
`make bench` runs one benchmark at a time and nothing else should run beside it."""


def main(argv: list[str] | None = None) -> int:
    cli = BenchCli("preemption", __doc__, quick_help="1 run each",
                   reps_help="runs per case (default 5, 3 torchrun)")  # fmt: skip
    cli.add_subset("--cases", CASES)
    bench = cli.parse(argv)
    trials: list[Trial] = []
    with tempfile.TemporaryDirectory(prefix="tf-preempt-") as tmp:
        for case in bench.args.cases:
            reps = bench.reps(3 if case.startswith("torchrun") else 5)
            for rep in range(reps):
                trial = run_trial(case, Path(tmp) / f"{case}-{rep}")
                trials.append(trial)
                print(f"[preemption] {case} run {rep + 1}/{reps}: {trial}",
                      file=sys.stderr, flush=True)  # fmt: skip
    bench.write_section("preemption", "Preemption: work lost on SIGTERM (process level)",
                        markdown(trials))  # fmt: skip
    bench.show(markdown(trials), summary(trials))
    return 0


if __name__ == "__main__":
    sys.exit(main())
