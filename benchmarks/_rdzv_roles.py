"""The rendezvous benchmark's multi-role comparison: N agents as one role vs K roles.

Where it sits: ``python -m benchmarks.rendezvous --roles K`` hands its trials
here in place of the main table (the hosts, store and etcd are the driver's).
Each repetition runs, for every N and torchflex backend, one trial of N agents
in one role and one of the same N split over K Independent roles (each role
``N / K`` agents under its own key id, as a multi-role job's agents run it),
in rotating order. Writes the ``rendezvous-roles`` section of RESULTS.md.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from benchmarks import report
from benchmarks._rdzv_stats import TrialOutcome
from benchmarks.cli import Bench

# torch has no Independent roles: only torchflex's backends are compared.
SYSTEMS = ("torchflex-c10d", "torchflex-etcd")
TARGET_RATIO = 1.10  # split over roles: within 10 % of one role

Trial = Callable[[str, int, int], TrialOutcome]  # (system, n, roles) -> outcome


def measure(
    trial: Trial, *, systems: Sequence[str], sizes: Sequence[int], reps: int, roles: int
) -> dict[tuple[str, int, int], list[TrialOutcome]]:
    """Results by (system, n, number of roles): 1 and ``roles``, interleaved."""
    out: dict[tuple[str, int, int], list[TrialOutcome]] = {}
    turn = 0
    for rep in range(reps):
        for n in sizes:
            for system in systems:
                order = (1, roles) if turn % 2 == 0 else (roles, 1)
                turn += 1
                for k in order:
                    outcome = trial(system, n, k)
                    out.setdefault((system, n, k), []).append(outcome)
                    shown = (
                        f"FAILED: {outcome.problem}"
                        if outcome.latency is None
                        else f"{outcome.latency * 1000:.0f} ms"
                    )
                    print(f"[rendezvous] rep {rep + 1}/{reps} n={n:>3} {system:<15} "
                          f"roles={k} {shown}", flush=True)  # fmt: skip
    return out


def _latencies(trials: Sequence[TrialOutcome]) -> list[float]:
    return [t.latency for t in trials if t.latency is not None]


def _cell(trials: Sequence[TrialOutcome]) -> str:
    ok = _latencies(trials)
    failed = len(trials) - len(ok)
    text = report.summarize([v * 1000 for v in ok]).fmt("ms", 0) if ok else "none"
    return text + (f", {failed} failed" if failed else "")


def ratio(one: Sequence[TrialOutcome], split: Sequence[TrialOutcome]) -> float | None:
    """Median latency split over roles / median latency as one role (None: not measured)."""
    a, b = _latencies(one), _latencies(split)
    if not a or not b:
        return None
    return report.summarize(b).median / report.summarize(a).median


def paired(one: Sequence[TrialOutcome], split: Sequence[TrialOutcome]) -> float | None:
    """Median over repetitions of split / one, each pair run back to back: a load that
    drifts over the run (a shared machine) moves both trials of a pair alike."""
    pairs = [
        b.latency / a.latency
        for a, b in zip(one, split, strict=True)
        if a.latency is not None and b.latency is not None and a.latency > 0
    ]
    return report.summarize(pairs).median if pairs else None


def _verdict(r: float | None) -> str:
    return "n/a" if r is None else f"{r:.2f}" + (" ok" if r <= TARGET_RATIO else "")


def body(
    results: dict[tuple[str, int, int], list[TrialOutcome]],
    *,
    systems: Sequence[str],
    sizes: Sequence[int],
    reps: int,
    roles: int,
    load: str,
    procs: int,
) -> str:
    header = ["N", "backend", "one role of N", f"{roles} roles of N/{roles}",
              "split / one (medians)", "split / one (paired)"]  # fmt: skip
    rows = []
    for n in sizes:
        for system in systems:
            one, split = results.get((system, n, 1), []), results.get((system, n, roles), [])
            rows.append([str(n), system, _cell(one), _cell(split), _verdict(ratio(one, split)),
                         _verdict(paired(one, split))])  # fmt: skip
    return f"""
N agents joining at once as one role (min = max = N), against the same N
agents split over {roles} Independent roles of N/{roles} (each role its own
rendezvous under its own key id, `<rdzv-id>.<role>`, as a multi-role job's
agents run them, on the same store at the same time), hosted as in the main
table in min(N, {procs}) processes, member i in role i mod {roles}. {reps} repetitions per
cell, the two layouts alternating within each repetition; median (min-max)
in milliseconds. Latency as in the main table, over all N agents: from the
last join of any role to the moment every agent of every role holds its
rank; a split trial counts only if every role formed its own group of
N/{roles}. Two ratios: of the two columns' medians, and the median of the
per-repetition ratios (the two layouts of a repetition run back to back, so
a load that drifts over the run moves both alike). Target: split / one <=
{TARGET_RATIO:.2f} ("ok").

{report.markdown_table(header, rows)}

Load. {load}
"""


def load_line(before: tuple[float, float, float], after: tuple[float, float, float]) -> str:
    """The load averages around the run, and whether other work shared the machine
    (``report.shared_before``)."""
    cores = os.cpu_count() or 1
    return (
        f"load average (1, 5, 15 min) {before[0]:.1f}, {before[1]:.1f}, {before[2]:.1f} "
        f"before the run and {after[0]:.1f}, {after[1]:.1f}, {after[2]:.1f} after, on "
        f"{cores} cores. "
        + (
            "Other work shared the machine: figures from a loaded machine, compare the "
            "columns within a row rather than with the main table."
            if report.shared_before(before[0])
            else report.IDLE_NOTE
        )
    )


def run(
    bench: Bench,
    trial: Trial,
    *,
    systems: Sequence[str],
    sizes: Sequence[int],
    reps: int,
    roles: int,
    procs: int,
) -> int:
    """Measure, print and (unless ``--no-write``/``--quick``) write the section."""
    bad = [n for n in sizes if n % roles]
    if bad:
        print(f"--roles {roles}: sizes {bad} do not split evenly", flush=True)
        return 2
    before = os.getloadavg()
    results = measure(trial, systems=systems, sizes=sizes, reps=reps, roles=roles)
    load = load_line(before, os.getloadavg())
    text = body(
        results, systems=systems, sizes=sizes, reps=reps, roles=roles, load=load, procs=procs
    )
    print(text)
    bench.write_section("rendezvous-roles", "Rendezvous latency: one role vs roles", text)
    return 0
