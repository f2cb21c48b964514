"""The operator-scale benchmark's results: what one job count measured, and its report.

Where it sits: ``benchmarks.operator_scale`` runs the control plane and
fills a ``SizeResult`` per job count; this module turns the list of them
into the RESULTS.md section (``body``), the plot (``plot``) and the
``--json`` object (``as_json``). Nothing here talks to a cluster.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks import report
from benchmarks._scale_stats import format_counts, growth, per_minute


@dataclasses.dataclass
class Config:
    jobs: list[int]
    pods: int
    nodes: int
    idle_s: float
    settle_s: float
    timeout_s: float
    fraction: float
    seed: int


@dataclasses.dataclass
class SizeResult:
    jobs: int
    pods: int
    create_s: float  # kubectl create of all jobs returned
    pods_exist_s: float | None
    pods_running_s: float | None
    jobs_running_s: float | None
    replaced: int
    unanswered: int
    repl_created: list[float]
    repl_running: list[float]
    peak_rss_mib: float
    idle_rss_mib: float
    cpu: dict[str, float]
    idle_window_s: float
    idle_counts: dict[tuple[str, str], int]
    create_requests: int
    problems: list[str]


def _lead_float(cell: str) -> float:
    """The number a table cell starts with (NaN for "n/a")."""
    try:
        return float(cell.split(maxsplit=1)[0])
    except (ValueError, IndexError):
        return float("nan")


def fmt_ms(values: Sequence[float], q: float) -> str:
    return f"{report.percentile(values, q) * 1000:.0f} ms" if values else "n/a"


def fmt_s(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} s"


def body(results: Sequence[SizeResult], cfg: Config) -> str:
    header = ["figure", *[f"{r.jobs} jobs ({r.jobs * r.pods} pods)" for r in results]]
    header.append("growth (y ~ jobs^k, first to last)")
    xs = [float(r.jobs) for r in results]

    def row(name: str, fn: Callable[[SizeResult], str]) -> list[str]:
        cells = [fn(r) for r in results]
        values = [_lead_float(c) for c in cells]
        return [name, *cells, growth(xs, values)]

    rows = [
        row("kubectl create of all jobs returned", lambda r: fmt_s(r.create_s)),
        row("all worker pods exist", lambda r: fmt_s(r.pods_exist_s)),
        row("all worker pods Running (kwok)", lambda r: fmt_s(r.pods_running_s)),
        row("all jobs phase Running", lambda r: fmt_s(r.jobs_running_s)),
        row("operator requests while creating (non-watch)", lambda r: str(r.create_requests)),
        row("deleted workers", lambda r: f"{r.replaced} ({r.unanswered} unanswered)"),
        row("delete -> replacement exists p50", lambda r: fmt_ms(r.repl_created, 50)),
        row("delete -> replacement exists p99", lambda r: fmt_ms(r.repl_created, 99)),
        row("delete -> replacement Running p50", lambda r: fmt_ms(r.repl_running, 50)),
        row("delete -> replacement Running p99", lambda r: fmt_ms(r.repl_running, 99)),
        row("operator peak RSS (VmHWM)", lambda r: f"{r.peak_rss_mib:.0f} MiB"),
        row("operator RSS while idle", lambda r: f"{r.idle_rss_mib:.0f} MiB"),
        row(
            "idle: requests/min (not watches)",
            lambda r: f"{per_minute(r.idle_counts, r.idle_window_s, watches=False):.1f}",
        ),
        row(
            "idle: watch (re)opens/min",
            lambda r: f"{per_minute(r.idle_counts, r.idle_window_s, watches=True):.1f}",
        ),
        row("CPU s: start-up (to watches open)", lambda r: f"{r.cpu['startup']:.1f}"),
        row("CPU s: create -> all Running", lambda r: f"{r.cpu['create']:.1f}"),
        row("CPU s per idle minute", lambda r: f"{r.cpu['idle_per_min']:.2f}"),
        row("CPU s: deletions -> replaced", lambda r: f"{r.cpu['replace']:.1f}"),
        row("CPU s: whole run", lambda r: f"{r.cpu['total']:.1f}"),
    ]
    idle_detail = "\n".join(
        f"- {r.jobs} jobs, {r.idle_window_s:.0f} s idle: {format_counts(r.idle_counts)}"
        for r in results
    )
    problems = "\n".join(f"- {r.jobs} jobs: {p}" for r in results for p in r.problems) or "- none"
    return f"""
{cfg.nodes} kwok nodes; jobs of {cfg.pods} workers (minReplicas = maxReplicas =
{cfg.pods}, default c10d rendezvous, so each job also gets a store pod and a
headless Service); one run per job count, each with a fresh operator process
and a fresh namespace. Times are from the start of one `kubectl create` of
all the jobs.

{report.markdown_table(header, rows)}

![operator scale](plots/operator_scale.png)

What is measured. The operator runs as its own process (`torchflex-operator
--namespace NS --standalone --no-agent-status-poll --metrics-port 0
--health-port 0`; the agent status poll is off because kwok pod IPs are fake
addresses that must not be dialled) with the admin credentials. Its API
traffic goes through a counting pass-through proxy on 127.0.0.1
(`benchmarks/_scale_proxy.py`): the API server's `apiserver_request_total`
has no per-client label and the local control plane has no audit log, so
this is the only way to count the operator's requests alone. Pods and jobs
are timed by watches the benchmark opens itself (arrival times of watch
events). kwok marks a pod Running as soon as it is bound, with no process,
and no agent ever reports; a job's phase is the operator's own: Running
once minReplicas workers are Running (see `planner.availability`), which
is what "jobs report Running" means here. RSS and CPU come from
`/proc/<pid>` of the operator (VmHWM, VmRSS, utime+stime). Idle: after all
were Running, {cfg.settle_s:.0f} s settle, then a {cfg.idle_s:.0f} s window.
Replacement: {cfg.fraction:.0%} of the worker pods, chosen at random
(seed {cfg.seed} + jobs), deleted one after another with grace period 0
(each delete timed on its own): the pod object goes at once, so the figure
is the operator's reaction, not a kubelet's stop. The k-th deletion of a
job is paired with the k-th new worker of that job seen after it
("exists"), and with the k-th new worker that ran and is still there
("Running"). Why not a graceful delete: kwok finishes one by deleting the
pod by name, without a UID precondition (`pod_controller.go`, kwok
v0.8.0); when that lands after the operator re-created the pod under the
same deterministic name, it deletes the replacement (in a trial run at 200
jobs, 378 replacements went that way and the Running p50 became 5.6 s). A
real kubelet deletes with the pod's UID as a precondition. A replacement
deleted by anyone but the operator is listed under "Problems seen".

Requests while idle, by verb and resource:
{idle_detail}

Problems seen:
{problems}
"""


def plot(results: Sequence[SizeResult]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r.jobs for r in results]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    ax = axes[0][0]
    series: dict[str, list[float | None]] = {
        "all pods exist": [r.pods_exist_s for r in results],
        "all pods Running": [r.pods_running_s for r in results],
        "all jobs Running": [r.jobs_running_s for r in results],
    }
    for label, ys in series.items():
        ax.plot(xs, [float("nan") if y is None else y for y in ys], marker="o", label=label)
    ax.set_title("create all jobs -> ... (s)")
    ax.legend()
    ax = axes[0][1]
    for q in (50, 99):
        ax.plot(xs, [report.percentile(r.repl_running, q) if r.repl_running else float("nan")
                     for r in results], marker="o", label=f"-> Running p{q}")  # fmt: skip
    ax.set_title("deleted pod -> replacement (s)")
    ax.legend()
    ax = axes[1][0]
    ax.plot(xs, [r.peak_rss_mib for r in results], marker="o", label="peak RSS")
    ax.set_title("operator memory (MiB)")
    ax = axes[1][1]
    ax.plot(xs, [r.cpu["create"] for r in results], marker="o", label="create -> Running")
    ax.plot(xs, [r.cpu["replace"] for r in results], marker="o", label="replacement")
    ax.plot(xs, [r.cpu["idle_per_min"] for r in results], marker="o", label="per idle minute")
    ax.set_title("operator CPU seconds")
    ax.legend()
    for row in axes:
        for a in row:
            a.set_xlabel("jobs")
            a.grid(True, alpha=0.3)
    return report.save_figure(fig, "operator_scale", dpi=100)


def as_json(results: Sequence[SizeResult]) -> dict[str, Any]:
    """One object per job count: the headline figures, seconds and MiB."""

    def pct(values: Sequence[float], q: float) -> float | None:
        return round(report.percentile(values, q), 3) if values else None

    return {
        "sizes": [
            {
                "jobs": r.jobs,
                "pods": r.jobs * r.pods,
                "all_pods_exist_s": r.pods_exist_s,
                "all_jobs_running_s": r.jobs_running_s,
                "replacement_running_p50_s": pct(r.repl_running, 50),
                "replacement_running_p99_s": pct(r.repl_running, 99),
                "peak_rss_mib": round(r.peak_rss_mib, 1),
                "idle_requests_per_min": per_minute(r.idle_counts, r.idle_window_s, watches=False),
                "cpu_s": {k: round(v, 2) for k, v in r.cpu.items()},
                "problems": r.problems,
            }
            for r in results
        ]
    }
