"""Recovery benchmark: a node dies (SIGKILL) — how long until the survivors train again?

Where it sits: ``python -m benchmarks.recovery`` (also run by ``make bench``
through ``benchmarks.__main__``). Process level, loopback only: the same
3-node job (``--nnodes 2:3``, one CPU/gloo worker per node running
``examples/train_elastic.py``, a step every 100 ms) under ``torchflex-agent``
and under stock ``torchrun`` (c10d rendezvous, default and tuned settings),
in one run; ``torchflex-state`` is ``torchflex-agent`` running
``examples/train_stateful.py`` (the same training adopting the state API of
issue 18: survivors re-form in place and resume from memory), measured the
same way. Each repetition:

1. start the job, wait until all 3 nodes train at world size 3;
2. SIGKILL one node's launcher and every process it spawned (a pod dying);
   the node killed is never the one hosting worker rank 0 (MASTER_ADDR) nor,
   under torchrun, the one hosting its rendezvous store (losing that one
   never recovers under torchrun; torchflex keeps its store in its own
   process, so for torchflex this choice changes nothing);
3. recovery = from the kill to the first completed step of the re-formed
   group (world 2) on *every* survivor (wall clock of the step lines); for
   ``torchflex-state`` also *resumed* = from the kill to every survivor's
   ``restored step=...`` line (its wall clock once it holds the state again
   and trains on: the step at world 2 is then still to come);
4. scale-up join: start a new node; join = from its launcher's start to the
   first completed step at world 3 on every node. For torchflex each run
   also prints (stderr) and keeps in ``--json``'s runs where that time
   went: seconds from the new node's start to its zygote ready, its join,
   the survivors' workers stopped, the rounds over, the new round formed,
   every worker started and resumed (``_proc_logs.join_phases``).

``--fault freeze`` instead SIGSTOPs the node's processes (a node that
freezes or drops off the network without closing its sockets): no socket
closes, so torchflex detects it by heartbeat timeout and kills the
survivors' stuck workers without a stop grace (target: liveness timeout +
0.5 s), while torchrun's survivors sit in the collective until its timeout;
their wait is capped (``--freeze-cap``) and reported as more than the cap.

Writes its section of ``benchmarks/RESULTS.md`` (not with ``--quick``);
``--json`` prints one JSON object.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks._proc_job import EXAMPLE, STATEFUL, TORCHRUN_CONF, Flavor, ProcJob, signal_tree
from benchmarks._proc_logs import join_phases, recovery_seconds, resumed_seconds
from benchmarks.cli import BenchCli
from benchmarks.report import markdown_table, phases_line, summarize

FLAVORS = ("torchflex", "torchflex-state", "torchrun-tuned", "torchrun-default")
_SCRIPTS = {"torchflex-state": STATEFUL}
# Per-phase bounds: generous multiples of the slowest expected case
# (torchrun defaults ~46 s to recover on a quiet machine).
_START_TIMEOUT = 120.0
_RECOVER_TIMEOUT = {
    "torchflex": 60.0, "torchflex-state": 60.0, "torchrun-tuned": 90.0, "torchrun-default": 150.0,
}  # fmt: skip
# Tuned torchrun's scale-up join never completed here (the newcomer stays in
# "Rendezvous'ing worker group" while the group trains on); don't wait long.
_JOIN_TIMEOUT = {
    "torchflex": 60.0, "torchflex-state": 60.0, "torchrun-tuned": 30.0, "torchrun-default": 90.0,
}  # fmt: skip
_WARM_STEPS = 5
_FREEZE_CAP_S = 90.0
_FAULTS = {"kill": signal.SIGKILL, "freeze": signal.SIGSTOP}


@dataclasses.dataclass
class Trial:
    flavor: str
    recovery_s: float | None = None
    join_s: float | None = None
    problem: str | None = None
    trace: list[str] = dataclasses.field(default_factory=list)
    join_phases: dict[str, float | None] = dataclasses.field(default_factory=dict)
    """Seconds from the new node's start to each milestone of its join (``_proc_logs``)."""
    resumed_s: float | None = None
    """Kill to every survivor's timed ``restored`` line (None: the script prints none)."""
    join_tried: bool = True
    """Whether a new node was started (not with ``--no-join``, a freeze, or no recovery)."""


def _trace(job: ProcJob, t0: float, until: float) -> list[str]:
    out = []
    for node in job.nodes:
        for t, line in node.timed():
            if t0 - 0.2 <= t <= until + 0.5:
                out.append(f"{t - t0:+7.3f} {node.name}: {line[:160]}")
    return sorted(out)


def run_trial(
    flavor: Flavor, workdir: Path, join: bool, trace: bool, *, fault: str = "kill",
    freeze_cap: float = _FREEZE_CAP_S,
) -> Trial:  # fmt: skip
    trial = Trial(flavor.name, join_tried=False)
    job = ProcJob(flavor, workdir, script=_SCRIPTS.get(flavor.name, EXAMPLE))
    try:
        if not job.start_training(3, _WARM_STEPS, _START_TIMEOUT):
            trial.problem = "the 3-node job did not start training"
            return trial
        victim, survivors = job.victim()
        killed_at = time.time()
        signal_tree(victim.proc.pid, _FAULTS[fault])  # a frozen tree is SIGKILLed by close()
        timeout = _RECOVER_TIMEOUT[flavor.name] if fault == "kill" else freeze_cap
        job.wait_training(survivors, 2, killed_at, 1, timeout)
        trial.recovery_s = recovery_seconds([n.steps() for n in survivors], killed_at, 2)
        trial.resumed_s = resumed_seconds([n.texts() for n in survivors], killed_at)
        if trace:
            trial.trace = _trace(job, killed_at, killed_at + (trial.recovery_s or timeout))
        if trial.recovery_s is None:
            trial.problem = f"survivors did not train at world 2 within {timeout:.0f} s"
            return trial
        if not join:
            return trial
        if not job.wait_training(survivors, 2, killed_at, _WARM_STEPS, 30):
            trial.problem = "survivors stopped training before the join"
            return trial
        joined_at = time.time()
        trial.join_tried = True
        newcomer = job.start_node()
        group = [*survivors, newcomer]
        timeout = _JOIN_TIMEOUT[flavor.name]
        job.wait_training(group, 3, joined_at, 1, timeout)
        trial.join_s = recovery_seconds([n.steps() for n in group], joined_at, 3)
        until = joined_at + (trial.join_s or timeout)
        trial.join_phases = join_phases(
            [n.timed() for n in group], len(group) - 1, joined_at, until
        )
        if trace:
            trial.trace += ["--- join ---", *_trace(job, joined_at, until)]
        if trial.join_s is None:
            trial.problem = f"the new node did not train at world 3 within {timeout:.0f} s"
        return trial
    finally:
        job.close()


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _fmt(values: list[float]) -> str:
    return summarize(values).fmt("s")


def summary(trials: list[Trial]) -> dict[str, Any]:
    by: dict[str, list[Trial]] = {f: [t for t in trials if t.flavor == f] for f in FLAVORS}

    def med(flavor: str, attr: str) -> float | None:
        vals = [getattr(t, attr) for t in by[flavor] if getattr(t, attr) is not None]
        return summarize(vals).median if vals else None

    out: dict[str, Any] = {}
    for flavor in FLAVORS:
        key = flavor.replace("-", "_")
        out[f"{key}_s"] = med(flavor, "recovery_s")
        out[f"{key}_resumed_s"] = med(flavor, "resumed_s")
        out[f"{key}_join_s"] = med(flavor, "join_s")
        out[f"{key}_runs"] = [
            {
                "recovery_s": t.recovery_s,
                "resumed_s": t.resumed_s,
                "join_s": t.join_s,
                "join_tried": t.join_tried,
                "problem": t.problem,
                "join_phases": t.join_phases,
            }
            for t in by[flavor]
        ]
    tf = out["torchflex_s"]
    for ref in ("default", "tuned"):
        other = out[f"torchrun_{ref}_s"]
        out[f"speedup_vs_{ref}"] = (other / tf) if tf and other else None
    return out


def _resumed(mine: list[Trial]) -> str:
    """The resumed column: n/a for a launcher whose script prints no timed ``restored``."""
    vals = [t.resumed_s for t in mine if t.resumed_s is not None]
    return _fmt(vals) if vals else "n/a"


def _runs(trials: list[Trial]) -> Iterator[tuple[str, list[Trial], list[float]]]:
    """Each launcher that ran: its trials and the recoveries they measured."""
    for flavor in FLAVORS:
        mine = [t for t in trials if t.flavor == flavor]
        if mine:
            yield flavor, mine, [t.recovery_s for t in mine if t.recovery_s is not None]


def markdown_freeze(trials: list[Trial], result: dict[str, Any], cap: float) -> str:
    rows = []
    for flavor, mine, rec in _runs(trials):
        capped = len(mine) - len(rec)
        shown = _fmt(rec) if rec else f"> {cap:.0f} s (cap)"
        rows.append([flavor, _resumed(mine), shown, f"{capped} / {len(mine)}"])
    table = markdown_table(
        ["launcher", "freeze → every survivor resumed (its `restored` line)",
         "freeze → every survivor completed a step at world 2",
         "runs not recovered within the cap"],
        rows,
    )  # fmt: skip
    return f"""{table}

Same job as the SIGKILL benchmark above, but the node is *frozen*: SIGSTOP of its
launcher and every process it spawned, left frozen (as a hung node or a cut network
would be), so no socket closes. torchflex: the frozen member's ring predecessor sees
its heartbeat counter stall for `--liveness-timeout` (1.5 s) on its own clock, marks
the round stale (MemberLost, recorded as *silent*), and every survivor SIGKILLs its
workers at once -- they are blocked in a gloo collective with the frozen peer and
could never reach a checkpoint, so no `--stop-grace` is spent -- then re-forms at the
expected size and forks new workers. Target: liveness timeout + 0.5 s = 2.0 s.
torchflex-state (the state API, in place): the same detection, then the survivors'
agents keep their workers and tell each to shut down its group's TCP links to the
frozen node (`state_unblock`), so their collective fails at once and they re-form in
place from their in-memory copies, with no new workers and no checkpoint read.
torchrun's survivors stay in the collective until gloo's timeout (the example's
`init_process_group` timeout, 60 s) fails them; the wait here is capped at
{cap:.0f} s and a run that hits the cap is reported as "> cap". The two recovery
columns are defined as in the SIGKILL section (from the SIGSTOP instead of the kill)."""


def markdown(trials: list[Trial], result: dict[str, Any]) -> str:
    rows = []
    for flavor, mine, rec in _runs(trials):
        joins = [t.join_s for t in mine if t.join_s is not None]
        tried = sum(t.join_tried for t in mine)
        failed = f"{len(mine) - len(rec)} / {tried - len(joins) if tried else 'not run'}"
        rows.append([flavor, _resumed(mine), _fmt(rec), _fmt(joins), failed])
    table = markdown_table(
        ["launcher", "SIGKILL → every survivor resumed (its `restored` line)",
         "SIGKILL → every survivor completed a step at world 2",
         "scale-up join (new node → all step at N+1)", "runs failed (recovery / join)"],
        rows,
    )  # fmt: skip
    problems = sorted({f"{t.flavor}: {t.problem}" for t in trials if t.problem})
    notes = "\n".join(f"- {p}" for p in problems)

    def ratio(key: str) -> str:
        value = result.get(key)
        return f"{value:.1f}x" if value else "n/a"

    return f"""{table}

{("Failures seen:" + chr(10) + notes) if notes else "No failed runs."}

Speed-up of torchflex (median recovery): {ratio("speedup_vs_default")} vs torchrun defaults,
{ratio("speedup_vs_tuned")} vs tuned torchrun (both from the completed-step column).
Targets: torchflex ≤ 2 s, ≥ 20x vs defaults, ≥ 2.5x vs tuned; join ≤ 3 s;
torchflex-state (the state API, in place) ≤ 0.15 s from the kill to every survivor resumed.

The job: 3 nodes (`--nnodes 2:3`), one worker each (`examples/train_elastic.py
--print-time`, gloo on CPU, a step every 100 ms, checkpoint every 10 steps and on
a peer's loss), all processes on 127.0.0.1. Each run SIGKILLs one node's launcher
*and every process it spawned* (read from /proc first), as a pod dying would. The
node killed holds neither worker rank 0 nor, under torchrun, its rendezvous store
(that node is `is_host=1`; killing it never recovers under torchrun, see DESIGN.md),
so torchrun is measured in its best case. Two recovery columns, both taken from the
workers' own wall clock (`--print-time`) and ending when the *last* survivor gets there:
*resumed* ends at the survivor's `restored step=N ... t=T` line, printed once it holds
the training state again and goes on training (only `examples/train_stateful.py`
prints it: n/a for the other launchers, whose script prints no timed line there);
*completed a step* ends at its first step line of the re-formed group of 2, so it also
holds that whole step (0.1 s here) and, when the loss is noticed only at the next
collective, the rest of the step in flight. Join is from the new launcher's start to
the first step at world 3 on every node (for torchflex this includes the new agent's
own start-up: Python, imports, rendezvous, its worker). `torchflex-state` runs
`examples/train_stateful.py` (the same training adopting the state API,
docs/state-api.md) under the same `torchflex-agent`: the survivors' workers keep their
processes, re-create the process group in place and resume from their in-memory copies.

torchrun settings: `--rdzv-backend c10d --max-restarts 100` (its default 0 ends the
job at the first loss) with `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` (with the shared
store a scale-up join can deadlock); *tuned* adds `--rdzv-conf
{TORCHRUN_CONF["tuned"]}` (integer seconds are the floor: 1 s keep-alive, a node
is evicted after 2 missed, 1 s last call). torchflex: `torchflex-agent` defaults
with a `torchflex-agent store` process as the c10d store.

Every process of the job shares the machine's cores (see the machine line);
`make bench` runs one benchmark at a time and nothing else should run beside it."""


def trials_from_json(result: dict[str, Any]) -> list[Trial]:
    """Rebuild the trials of a ``--json`` result (to re-render its section)."""
    out = []
    for flavor in FLAVORS:
        for run in result.get(f"{flavor.replace('-', '_')}_runs", []):
            out.append(
                Trial(flavor, run["recovery_s"], run["join_s"], run["problem"],
                      resumed_s=run.get("resumed_s"), join_tried=run.get("join_tried", True))
            )  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    cli = BenchCli("recovery", __doc__, quick_help="1 run each",
                   reps_help="runs per launcher (default 5, 3)")  # fmt: skip
    cli.add_subset("--flavors", FLAVORS)
    cli.add_argument("--no-join", action="store_true", help="skip the scale-up join")
    cli.add_argument("--trace", action="store_true", help="print log lines around each event")
    cli.add_argument("--fault", choices=sorted(_FAULTS), default="kill",
                     help="kill: SIGKILL the node (default); freeze: SIGSTOP it")  # fmt: skip
    cli.add_argument("--freeze-cap", type=float, default=_FREEZE_CAP_S,
                     help="with --fault freeze: longest wait for a recovery (s)")  # fmt: skip
    bench = cli.parse(argv)
    args = bench.args
    freeze = args.fault == "freeze"
    trials: list[Trial] = []
    with tempfile.TemporaryDirectory(prefix="tf-recovery-") as tmp:
        for flavor in args.flavors:
            reps = bench.reps(3 if flavor == "torchrun-default" else 5)
            for rep in range(reps):
                trial = run_trial(Flavor(flavor), Path(tmp) / f"{flavor}-{rep}",
                                  join=not (args.no_join or freeze), trace=args.trace,
                                  fault=args.fault, freeze_cap=args.freeze_cap)  # fmt: skip
                trials.append(trial)
                print(
                    f"[recovery] {flavor} run {rep + 1}/{reps}: resumed {_num(trial.resumed_s)}"
                    f" s, recovery {_num(trial.recovery_s)} s, join {_num(trial.join_s)} s"
                    f"{'  PROBLEM: ' + trial.problem if trial.problem else ''}",
                    file=sys.stderr,
                    flush=True,
                )
                if any(v is not None for v in trial.join_phases.values()):
                    phases = phases_line(trial.join_phases)
                    print(
                        f"   join phases (s from the new node's start): {phases}", file=sys.stderr
                    )
                for line in trial.trace:
                    print("   " + line, file=sys.stderr)
    result = summary(trials)
    body = markdown_freeze(trials, result, args.freeze_cap) if freeze else markdown(trials, result)
    if freeze:
        bench.write_section("recovery_freeze", "Recovery after a node freezes (process level)",
                            body)  # fmt: skip
    else:
        bench.write_section("recovery", "Recovery after a node's death (process level)", body)
    bench.show(body, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
