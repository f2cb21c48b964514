"""Results of the cluster-level recovery benchmark: one run's record, JSON and RESULTS.md text.

Where it sits: ``benchmarks.recovery_cluster`` fills a :class:`Trial` per
repetition; this module (pure, unit-tested in
``tests/unit/benchmarks/test_recovery_cluster.py``) turns them into the
``--json`` object and the markdown of its RESULTS.md section, with
``benchmarks.report`` for the statistics and the table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from benchmarks._cluster_logs import speedup
from benchmarks._proc_job import TORCHRUN_CONF
from benchmarks.report import markdown_table, summarize

FLAVORS = ("torchflex", "torchflex-spare", "torchrun-tuned", "torchrun-default")
# The figures of a Trial, in table order.
FIGURES = ("recovery_s", "regrow_s", "join_s", "join_from_running_s", "new_pod_running_s")


@dataclasses.dataclass
class Trial:
    """What one repetition (one job) measured; None = not measured or timed out."""

    flavor: str
    recovery_s: float | None = None
    reformed_world: int | None = None
    regrow_s: float | None = None
    join_s: float | None = None
    join_from_running_s: float | None = None
    new_pod_running_s: float | None = None
    fresh_job: bool = False
    problems: list[str] = dataclasses.field(default_factory=list)
    join_phases: dict[str, float | None] = dataclasses.field(default_factory=dict)
    """Seconds from the scale request to each milestone of the join (``_cluster_logs``)."""

    def line(self) -> str:
        def num(v: float | None) -> str:
            return "n/a" if v is None else f"{v:.2f} s"

        out = (
            f"recovery {num(self.recovery_s)} (world {self.reformed_world}), "
            f"regrow {num(self.regrow_s)}, join {num(self.join_s)} "
            f"({num(self.join_from_running_s)} after Running)"
        )
        return out + "".join(f"  PROBLEM: {p}" for p in self.problems)


def _key(flavor: str) -> str:
    return flavor.replace("-", "_")


def _values(trials: Sequence[Trial], flavor: str, figure: str) -> list[float]:
    return [
        float(v) for t in trials if t.flavor == flavor and (v := getattr(t, figure)) is not None
    ]


def summary(trials: Sequence[Trial]) -> dict[str, Any]:
    """The ``--json`` object: medians per launcher and figure, speed-ups, every run."""
    out: dict[str, Any] = {}
    for flavor in FLAVORS:
        key = _key(flavor)
        for figure in FIGURES:
            vals = _values(trials, flavor, figure)
            name = key + "_s" if figure == "recovery_s" else f"{key}_{figure}"
            out[name] = summarize(vals).median if vals else None
        out[f"{key}_runs"] = [dataclasses.asdict(t) for t in trials if t.flavor == flavor]
    for ref in ("default", "tuned"):
        out[f"speedup_vs_{ref}"] = speedup(out[f"torchrun_{ref}_s"], out["torchflex_s"])
        out[f"join_speedup_vs_{ref}"] = speedup(
            out[f"torchrun_{ref}_join_s"], out["torchflex_join_s"]
        )
    out["spare_join_speedup"] = speedup(out["torchflex_join_s"], out["torchflex_spare_join_s"])
    return out


def _cell(trials: Sequence[Trial], flavor: str, figure: str) -> str:
    mine = [t for t in trials if t.flavor == flavor]
    vals = _values(trials, flavor, figure)
    text = summarize(vals).fmt("s")
    missing = len(mine) - len(vals)
    return text + (f"; {missing} of {len(mine)} not reached" if missing else "")


def _worlds(trials: Sequence[Trial], flavor: str) -> str:
    worlds = [t.reformed_world for t in trials if t.flavor == flavor and t.reformed_world]
    return ", ".join(str(w) for w in worlds) or "n/a"


def markdown(trials: Sequence[Trial], result: dict[str, Any], kill: str) -> str:
    flavors = [f for f in FLAVORS if any(t.flavor == f for t in trials)]
    rows = [
        [
            f,
            _cell(trials, f, "recovery_s"),
            _worlds(trials, f),
            _cell(trials, f, "regrow_s"),
            _cell(trials, f, "join_s"),
            "n/a (no new pod)"
            if f == "torchflex-spare"
            else _cell(trials, f, "join_from_running_s"),
        ]
        for f in flavors
    ]
    table = markdown_table(
        ["launcher", "recovery (kill → re-formed group steps on every survivor)",
         "re-formed at world size", "regrow (kill → replacement pod trains, world 3)",
         "scale-up join (scale request → all 3 pods step at world 3)",
         "join from the new pod Running"],
        rows,
    )  # fmt: skip
    problems = sorted({f"{t.flavor}: {p}" for t in trials for p in t.problems})
    notes = "\n".join(f"- {p}" for p in problems) if problems else "None."
    fresh = sum(1 for t in trials if t.fresh_job)

    def ratio(key: str) -> str:
        value = result.get(key)
        return f"{value:.1f}x" if value else "n/a"

    how = (
        "SIGKILLs the pod's agent and workers (every process carrying the pod's "
        "identity, found in /proc), like a machine dying; the process kubelet then reports "
        "the pod Failed and the operator creates a replacement"
        if kill == "sigkill"
        else "force-deletes the pod (`kubectl delete pod --grace-period=0 --force`); the "
        "process kubelet kills its processes and the operator recreates it"
    )
    return f"""{table}

Speed-up of torchflex (median recovery): {ratio("speedup_vs_default")} vs torchrun
defaults, {ratio("speedup_vs_tuned")} vs tuned torchrun. Scale-up join:
{ratio("join_speedup_vs_default")} vs defaults, {ratio("join_speedup_vs_tuned")} vs tuned;
a warm spare joins {ratio("spare_join_speedup")} faster than a new pod.
Targets: recovery ≤ 2 s, join ≤ 3 s; join from `kubectl scale` < 2 s (issue 18).

Problems seen (a timeout is reported here, never as a number):
{notes}

The job: an ElasticJob (min 2, max 3, one worker per pod running
`examples/train_elastic.py --print-time`, gloo on CPU, a step every 100 ms,
checkpoint every 10 steps) on the local control plane (`e2e.cluster`: real
kube-apiserver, scheduler and controller-manager, the `torchflex-operator`
process, pods as real processes on the process kubelet). One job per run: it
starts at `replicas: 2`; the join is `kubectl scale ej/NAME --replicas=3`,
measured from the request, and from the new pod first seen Running (API watch),
to the first step at world size 3 on every pod. {fresh} run(s) killed on a fresh
job started at 3 because the join did not complete. Then the run {how}; the pod
killed never holds worker rank 0. *Recovery*: from the kill to the first step of the
re-formed group on every survivor, i.e. per survivor the first step line after its
first `resumed from step=` line written after its last step before the kill (every
new worker prints it; a checkpoint always exists); the group may re-form at 2, or
at 3 when the replacement pod is in time. *Regrow*: from the kill to the first step
at world size 3 with the replacement pod, on every pod. Times are the workers' own
step stamps (`t=`, wall clock, same machine) against the benchmark's clock, so
there is no log-polling resolution; the new pod's Running time is as seen by a watch.

torchrun: the job's command is a plain `torchrun --rdzv-backend=c10d
--rdzv-endpoint=NAME-store.NS:29400 --max-restarts=100` (the operator only injects
env; the job's store pod serves the c10d rendezvous, so no worker pod hosts it)
with `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`; *tuned* adds `--rdzv-conf
{TORCHRUN_CONF["tuned"]}`. Same settings as the process-level benchmark.
torchflex: the operator wraps the command in `torchflex-agent` with its defaults.
*torchflex-spare* is the same job with `warmSpares: 1`: at `replicas: 2` the
operator keeps a third pod running whose agent has imported torch and waits out
of the rendezvous; the scale request promotes that pod (one annotation patch the
kubelet projects into it) instead of creating one, so its join has no pod start
and no imports, and "join from the new pod Running" does not apply (n/a). After
the join the job is at `maxReplicas`: no spare is left, and its kill and regrow
are the same as torchflex's (a replacement pod starts cold).
The operator runs with the e2e settings (`--backoff-base 0.5 --backoff-cap 5`).

Every pod's processes, the control plane and the operator share the machine's
cores (see the machine line); `make bench` runs one benchmark at a time and
nothing else should run beside it."""
