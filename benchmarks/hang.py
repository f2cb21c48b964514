"""Hang benchmark: a rank stops taking part, its process alive -- how long until training again?

Where it sits: ``python -m benchmarks.hang`` (also run by ``make bench``
through ``benchmarks.__main__``). Process level, loopback only: the same
3-node job (``--nnodes 2:3``, one CPU/gloo worker per node running
``tests/e2e/stall_train.py``, the example's loop, a step every 100 ms) under
``torchflex-agent`` and under stock ``torchrun``, in one run. In its first run
rank 1 stops taking part at step 30 (it sleeps in its own code; no socket
closes, no heartbeat stops); after a restart it trains normally. Measured:
from the last step line before the hang to the first step line after it on
*every* node (the workers' own wall clock).

Launchers: ``torchflex`` with ``--hang-timeout 20`` and ``torchflex-auto``
(the default: derived from the step time, here its 60 s floor); torchrun has no
hang detection, so its workers wait for gloo's collective timeout:
``torchrun-tuned`` is a script that sets 60 s (``init_process_group(timeout=)``,
what a careful user writes), ``torchrun-default`` torch's default 30 minutes.
Every wait is capped (``--cap``, default 150 s) and a capped run is reported as
more than the cap.

Writes its section of ``benchmarks/RESULTS.md`` (not with ``--quick``);
``--json`` prints one JSON object.
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._proc_job import REPO, Flavor, ProcJob
from benchmarks._proc_logs import recovery_seconds
from benchmarks.cli import BenchCli
from benchmarks.report import markdown_table, summarize

FLAVORS = ("torchflex", "torchflex-auto", "torchrun-tuned", "torchrun-default")
SCRIPT = str(REPO / "tests" / "e2e" / "stall_train.py")
STALL_AT = 30
_AGENT_ARGS = {"torchflex": ("--hang-timeout", "20"), "torchflex-auto": ()}
_COLLECTIVE_S = {"torchrun-tuned": "60", "torchrun-default": "1800"}
_START_TIMEOUT = 120.0
_CAP_S = 150.0


@dataclasses.dataclass
class Trial:
    flavor: str
    recovery_s: float | None = None
    problem: str | None = None


def run_trial(flavor: str, workdir: Path, cap: float) -> Trial:
    trial = Trial(flavor)
    env = {"STALL_RANK": "1", "STALL_AT": str(STALL_AT)}
    env["COLLECTIVE_TIMEOUT_S"] = _COLLECTIVE_S.get(flavor, "1800")
    kind = Flavor("torchrun-tuned" if flavor == "torchrun-tuned" else flavor)
    job = ProcJob(
        kind, workdir, script=SCRIPT, agent_args=_AGENT_ARGS.get(flavor, ()), extra_env=env
    )
    try:
        if not job.start_training(3, 5, _START_TIMEOUT):
            trial.problem = "the 3-node job did not start training"
            return trial
        stalled = _wait_stalled(job, 60.0)
        if stalled is None:
            trial.problem = f"the job did not stop at step {STALL_AT}"
            return trial
        job.wait_training(job.nodes, 3, stalled + 0.001, 1, cap)
        trial.recovery_s = recovery_seconds([n.steps() for n in job.nodes], stalled + 0.001, 3)
        if trial.recovery_s is None:
            trial.problem = f"not training again within the {cap:.0f} s cap"
            _explain(job)
        return trial
    finally:
        job.close()


def _explain(job: ProcJob) -> None:
    """stderr: each launcher's round and hang lines, for a run that did not recover."""
    for node in job.nodes:
        lines = [x for x in node.texts() if "step=" not in x and ("round" in x or "hang" in x)]
        print(f"   {node.name}:", *lines[-8:], sep="\n     ", file=sys.stderr)


def _wait_stalled(job: ProcJob, timeout: float) -> float | None:
    """Wall time of the last step line before the hang, once steps stopped for 2 s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        steps = [s for n in job.nodes for s in n.steps()]
        if steps and max(s.step for s in steps) >= STALL_AT - 1:
            last = max(s.t for s in steps)
            if time.time() - last > 2.0:
                return last
        time.sleep(0.2)
    return None


def summary(trials: list[Trial]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for flavor in FLAVORS:
        mine = [t for t in trials if t.flavor == flavor]
        vals = [t.recovery_s for t in mine if t.recovery_s is not None]
        key = flavor.replace("-", "_")
        out[f"{key}_s"] = summarize(vals).median if vals else None
        out[f"{key}_runs"] = [dataclasses.asdict(t) for t in mine]
    return out


def markdown(trials: list[Trial], cap: float) -> str:
    rows = []
    for flavor in FLAVORS:
        mine = [t for t in trials if t.flavor == flavor]
        if not mine:
            continue
        vals = [t.recovery_s for t in mine if t.recovery_s is not None]
        shown = summarize(vals).fmt("s") if vals else f"> {cap:.0f} s (cap)"
        rows.append([flavor, shown, f"{len(mine) - len(vals)} / {len(mine)}"])
    table = markdown_table(
        ["launcher", "last step before the hang → every node stepping again",
         "runs not recovered within the cap"],
        rows,
    )  # fmt: skip
    problems = sorted({f"{t.flavor}: {t.problem}" for t in trials if t.problem})
    notes = "\n".join(f"- {p}" for p in problems)
    return f"""{table}

{("Runs that did not recover:" + chr(10) + notes) if notes else "Every run recovered."}

The job: 3 nodes (`--nnodes 2:3`), one worker each (`tests/e2e/stall_train.py`, the
example's loop and checkpoints, gloo on CPU, a step every 100 ms), all on 127.0.0.1.
In its first run rank 1 stops taking part at step {STALL_AT}: it sleeps in its own
code with its process alive, so ranks 0 and 2 block in their next all-reduce, no
socket closes and every heartbeat goes on. torchflex: the fork server's hooks see no
optimizer step or forward anywhere in the job for the hang timeout (`torchflex`:
`--hang-timeout 20`; `torchflex-auto`: the default, derived from the step time, here
its 60 s floor), every member records its ranks' stacks, the workers restart (one
counted restart) and resume from the last checkpoint. torchrun has no hang
detection: the blocked ranks wait for gloo's collective timeout, then fail, and
torchrun restarts the group (`--max-restarts 100`): `torchrun-tuned` runs the same
script with `init_process_group(timeout=60 s)`, `torchrun-default` with torch's
default (30 minutes). Waits are capped at {cap:.0f} s; a capped run is reported as
more than the cap. Time is from the last step line printed before the hang to the
first step line after it on every node (the workers' own wall clock)."""


def main(argv: list[str] | None = None) -> int:
    cli = BenchCli("hang", __doc__, quick_help="1 run each", reps_help="runs per launcher (1)")
    cli.add_subset("--flavors", FLAVORS)
    cli.add_argument("--cap", type=float, default=_CAP_S, help="longest wait for a recovery (s)")
    bench = cli.parse(argv)
    args = bench.args
    trials: list[Trial] = []
    with tempfile.TemporaryDirectory(prefix="tf-hang-") as tmp:
        for flavor in args.flavors:
            reps = bench.reps(1)
            for rep in range(reps):
                trial = run_trial(flavor, Path(tmp) / f"{flavor}-{rep}", args.cap)
                trials.append(trial)
                shown = "n/a" if trial.recovery_s is None else f"{trial.recovery_s:.1f}"
                extra = f"  PROBLEM: {trial.problem}" if trial.problem else ""
                print(f"[hang] {flavor} run {rep + 1}/{reps}: {shown} s{extra}", file=sys.stderr)
    body = markdown(trials, args.cap)
    bench.write_section("hang", "A rank stops taking part: hang to training (process level)", body)
    bench.show(body, summary(trials))
    return 0


if __name__ == "__main__":
    sys.exit(main())
