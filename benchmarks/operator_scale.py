"""Benchmark 4: the operator at scale on kwok's fake nodes.

Where it sits: ``python -m benchmarks.operator_scale`` (also run by ``make
bench``). Uses the local control plane of ``TORCHFLEX_CLUSTER_SLOT`` (started
if needed), adds kwok nodes, and for each job count runs a fresh operator
process (``torchflex-operator``, its API traffic through
``benchmarks._scale_proxy`` so every request it makes is counted) in a fresh
namespace: create all jobs at once, wait for every pod and job, sit idle,
delete a fraction of the workers, wait for replacements. Watches in
``benchmarks._scale_watch`` timestamp what happens; ``_scale_stats`` holds
the arithmetic. Writes the ``operator_scale`` section of RESULTS.md and
``benchmarks/plots/operator_scale.png`` (never with ``--quick``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from benchmarks import report
from benchmarks._scale_procs import REPO, free_port, start_logged, stop
from benchmarks._scale_stats import (
    count_by,
    cpu_seconds,
    format_counts,
    growth,
    parse_log,
    per_minute,
    replacement_latencies,
    status_kib,
)
from benchmarks._scale_watch import Tracker
from e2e.cluster import Cluster, ensure_up
from e2e.cluster.layout import KWOK_TAINT_KEY
from torchflex_contract import labels

TICKS = os.sysconf("SC_CLK_TCK")


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


def job_manifest(name: str, pods: int) -> dict[str, Any]:
    """A fixed-size job whose pods land on kwok nodes (they "run" with no process)."""
    toleration = {"key": KWOK_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
    return {
        "apiVersion": labels.API_VERSION,
        "kind": labels.KIND,
        "metadata": {"name": name},
        "spec": {
            "minReplicas": pods,
            "maxReplicas": pods,
            "template": {
                "spec": {
                    "nodeSelector": {"type": "kwok"},
                    "tolerations": [toleration],
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "trainer", "image": "fake", "command": ["true"]}],
                }
            },
        },
    }


class Operator:
    """``torchflex-operator`` as its own process, read from /proc by PID."""

    def __init__(self, kubeconfig: Path, namespace: str, log: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
        env["KUBECONFIG"] = str(kubeconfig)
        cmd = [
            str(Path(sys.executable).parent / "torchflex-operator"),
            "--namespace", namespace, "--standalone",
            # kwok pod IPs are fake addresses off loopback and the bridge: no polling.
            "--no-agent-status-poll",
            "--metrics-port", "0", "--health-port", "0",
        ]  # fmt: skip
        self.proc = start_logged(cmd, log, env=env)
        self.pid = self.proc.pid

    def cpu(self) -> float:
        return cpu_seconds(Path(f"/proc/{self.pid}/stat").read_text(), TICKS)

    def rss_mib(self, field: str) -> float:
        return status_kib(Path(f"/proc/{self.pid}/status").read_text(), field) / 1024

    def stop(self) -> None:
        stop(self.proc, grace=15)


def wait_until(what: str, pred: Callable[[], bool], timeout: float, every: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(every)
    print(f"[operator_scale] gave up waiting for {what} after {timeout:.0f} s", flush=True)
    return False


def ensure_kwok_nodes(cluster: Cluster, count: int, timeout: float) -> None:
    cluster.kwok_nodes(count, prefix="bench-kwok")

    def ready() -> bool:
        items = cluster.get_json("nodes", "-l", "type=kwok")["items"]
        ok = sum(
            1
            for n in items
            if n["metadata"]["name"].startswith("bench-kwok-")
            and any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in n.get("status", {}).get("conditions", [])
            )
        )
        return ok >= count

    if not wait_until(f"{count} kwok nodes Ready", ready, timeout, every=2):
        raise TimeoutError(f"kwok nodes not Ready after {timeout:.0f}s")


def proxy_kubeconfig(path: Path, port: int) -> None:
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "p", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "p", "context": {"cluster": "p", "user": "u"}}],
        "current-context": "p",
    }
    path.write_text(yaml.safe_dump(cfg))


def run_size(
    cluster: Cluster, cfg: Config, jobs: int, *, work: Path, proxy_kc: Path, proxy_log: Path
) -> SizeResult:
    ns = f"bench-scale-{jobs}-{uuid.uuid4().hex[:6]}"
    expected = jobs * cfg.pods
    problems: list[str] = []
    cluster.kubectl("create", "namespace", ns)
    api = cluster.api_client()
    tracker = Tracker(api, ns)
    tracker.start()
    op_start = time.monotonic()
    op = Operator(proxy_kc, ns, work / f"operator-{jobs}.log")
    try:

        def watching() -> bool:
            reqs = parse_log(proxy_log.read_text()) if proxy_log.exists() else []
            return any(
                r.t >= op_start and r.verb == "watch" and r.resource.endswith("elasticjobs")
                for r in reqs
            )

        if not wait_until("the operator's ElasticJob watch", watching, 120):
            raise RuntimeError(f"operator did not start; see {work}/operator-{jobs}.log")
        time.sleep(2)  # let its other watches open before the clock starts
        cpu = {"startup": op.cpu()}
        docs = [job_manifest(f"j{i:04d}", cfg.pods) for i in range(jobs)]
        t0 = time.monotonic()
        cpu0 = op.cpu()
        cluster.kubectl(
            "create", "-n", ns, "-f", "-", input=yaml.safe_dump_all(docs), timeout=cfg.timeout_s
        )
        create_s = time.monotonic() - t0

        def all_up() -> bool:
            workers = tracker.workers()
            phases = tracker.phases()
            failed = [name for name, ph in phases.items() if ph == "Failed"]
            if failed:
                raise RuntimeError(f"{len(failed)} job(s) Failed, e.g. {failed[0]}; see the log")
            return (
                len(workers) >= expected
                and all(p.running is not None for p in workers)
                and len(phases) == jobs
                and all(ph == "Running" for ph in phases.values())
            )

        if not wait_until("all pods and jobs Running", all_up, cfg.timeout_s, every=1):
            problems.append("not every pod/job reached Running within the bound")
        t_up = time.monotonic()
        cpu["create"] = op.cpu() - cpu0
        pods = [p for p in tracker.snapshot().values() if p.role == labels.Role.WORKER]
        added = sorted(p.added for p in pods)
        running = sorted(p.running for p in pods if p.running is not None)
        pods_exist = added[expected - 1] - t0 if len(added) >= expected else None
        pods_running = running[expected - 1] - t0 if len(running) >= expected else None
        job_times = list(tracker.job_running_at.values())
        jobs_running = max(job_times) - t0 if len(job_times) == jobs else None
        creq = count_by(parse_log(proxy_log.read_text()), t0, t_up)
        create_requests = sum(n for (verb, _r), n in creq.items() if verb != "watch")

        time.sleep(cfg.settle_s)
        idle0, cpu_i0 = time.monotonic(), op.cpu()
        time.sleep(cfg.idle_s)
        idle1 = time.monotonic()
        cpu["idle_per_min"] = (op.cpu() - cpu_i0) * 60 / (idle1 - idle0)
        idle_counts = count_by(parse_log(proxy_log.read_text()), idle0, idle1)
        idle_rss = op.rss_mib("VmRSS")

        before = tracker.snapshot()
        live = [p for p in before.values() if p.role == labels.Role.WORKER and p.gone is None]
        victims = random.Random(cfg.seed + jobs).sample(live, max(1, int(len(live) * cfg.fraction)))
        from kubernetes import client

        core = client.CoreV1Api(api)
        deletions: dict[str, list[float]] = {}
        cpu_d0 = op.cpu()
        for v in victims:
            deletions.setdefault(v.job, []).append(time.monotonic())
            core.delete_namespaced_pod(v.name, ns)

        def replaced() -> bool:
            new = [
                p
                for uid, p in tracker.snapshot().items()
                if uid not in before and p.role == labels.Role.WORKER
            ]
            return len(new) >= len(victims) and all(p.running is not None for p in new)

        if not wait_until("replacements Running", replaced, cfg.timeout_s):
            problems.append("not every deleted pod was replaced within the bound")
        cpu["replace"] = op.cpu() - cpu_d0
        new = [
            p
            for uid, p in tracker.snapshot().items()
            if uid not in before and p.role == labels.Role.WORKER
        ]
        arrivals: dict[str, list[float]] = {}
        ran: dict[str, list[float]] = {}
        for p in new:
            arrivals.setdefault(p.job, []).append(p.added)
            if p.running is not None:
                ran.setdefault(p.job, []).append(p.running)
        repl_created, unanswered = replacement_latencies(deletions, arrivals)
        repl_running, _ = replacement_latencies(deletions, ran)
        peak = op.rss_mib("VmHWM")
        cpu["total"] = op.cpu()
        if tracker.errors:
            problems.append(f"{len(tracker.errors)} watch reopen(s): {tracker.errors[0]}")
        return SizeResult(
            jobs, cfg.pods, create_s, pods_exist, pods_running, jobs_running,
            len(victims), unanswered, repl_created, repl_running, peak, idle_rss, cpu,
            idle1 - idle0, idle_counts, create_requests, problems,
        )  # fmt: skip
    finally:
        tracker.stop()
        teardown(cluster, ns, op, cfg.timeout_s)


def teardown(cluster: Cluster, ns: str, op: Operator, timeout: float) -> None:
    """Delete the namespace while the operator still runs (it removes its finalizers)."""
    cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)

    def gone() -> bool:
        return cluster.kubectl("get", "namespace", ns, check=False).returncode != 0

    if not wait_until(f"namespace {ns} deleted", gone, min(timeout, 600), every=2):
        # Leave nothing stuck: drop the jobs' finalizers by hand.
        out = cluster.kubectl("get", "elasticjobs", "-n", ns, "-o", "name", check=False)
        for name in out.stdout.split():
            cluster.kubectl(
                "patch", "-n", ns, name, "--type=merge", "-p",
                json.dumps({"metadata": {"finalizers": None}}), check=False,
            )  # fmt: skip
    op.stop()


def _lead_float(cell: str) -> float:
    """The number a table cell starts with (NaN for "n/a")."""
    try:
        return float(cell.split(maxsplit=1)[0])
    except (ValueError, IndexError):
        return float("nan")


def _ms(values: Sequence[float], q: float) -> str:
    return f"{report.percentile(values, q) * 1000:.0f} ms" if values else "n/a"


def _s(value: float | None) -> str:
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
        row("kubectl create of all jobs returned", lambda r: _s(r.create_s)),
        row("all worker pods exist", lambda r: _s(r.pods_exist_s)),
        row("all worker pods Running (kwok)", lambda r: _s(r.pods_running_s)),
        row("all jobs phase Running", lambda r: _s(r.jobs_running_s)),
        row("operator requests while creating (non-watch)", lambda r: str(r.create_requests)),
        row("deleted workers", lambda r: f"{r.replaced} ({r.unanswered} unanswered)"),
        row("delete -> replacement exists p50", lambda r: _ms(r.repl_created, 50)),
        row("delete -> replacement exists p99", lambda r: _ms(r.repl_created, 99)),
        row("delete -> replacement Running p50", lambda r: _ms(r.repl_running, 50)),
        row("delete -> replacement Running p99", lambda r: _ms(r.repl_running, 99)),
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
(seed {cfg.seed} + jobs), deleted one after another (each delete timed on
its own); the k-th deletion of a job is paired with the k-th new worker of
that job seen after it.

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
    fig.tight_layout()
    report.PLOTS_DIR.mkdir(exist_ok=True)
    path = report.PLOTS_DIR / "operator_scale.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.operator_scale", description=__doc__)
    p.add_argument("--quick", action="store_true", help="20 jobs x 4 pods, 50 nodes; no RESULTS.md")
    p.add_argument("--jobs", type=int, nargs="+", help="job counts (default 20 50 100 200)")
    p.add_argument("--pods-per-job", type=int, help="workers per job (default 16)")
    p.add_argument("--nodes", type=int, help="kwok nodes (default 500)")
    p.add_argument("--idle", type=float, help="idle window in seconds (default 120)")
    p.add_argument("--settle", type=float, default=15.0, help="seconds before the idle window")
    p.add_argument("--timeout", type=float, help="bound of each wait (s; 1200, quick 300)")
    p.add_argument("--delete-fraction", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--no-write", action="store_true", help="do not touch RESULTS.md / plots")
    args = p.parse_args(argv)
    q = args.quick
    cfg = Config(
        jobs=args.jobs or ([20] if q else [20, 50, 100, 200]),
        pods=args.pods_per_job or (4 if q else 16),
        nodes=args.nodes or (50 if q else 500),
        idle_s=args.idle or (30.0 if q else 120.0),
        settle_s=args.settle,
        timeout_s=args.timeout or (300.0 if q else 1200.0),
        fraction=args.delete_fraction,
        seed=args.seed,
    )
    write = not (q or args.no_write)
    cluster = ensure_up()
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    cluster.kubectl(
        "wait", "--for=condition=Established", "crd/elasticjobs.torchflex.io", "--timeout=60s"
    )
    t = time.monotonic()
    ensure_kwok_nodes(cluster, cfg.nodes, 300)
    print(f"[operator_scale] {cfg.nodes} kwok nodes Ready in {time.monotonic() - t:.0f} s")
    work = Path(tempfile.mkdtemp(prefix="tf-bench-scale-"))
    port = free_port()
    proxy_log = work / "requests.log"
    proxy = start_logged(
        [sys.executable, "-m", "benchmarks._scale_proxy", str(cluster.kubeconfig), str(port),
         str(proxy_log)],
        work / "proxy.out",
    )  # fmt: skip
    results: list[SizeResult] = []
    ok = False
    try:
        proxy_kc = work / "proxy.kubeconfig"
        proxy_kubeconfig(proxy_kc, port)
        for jobs in cfg.jobs:
            t = time.monotonic()
            r = run_size(cluster, cfg, jobs, work=work, proxy_kc=proxy_kc, proxy_log=proxy_log)
            results.append(r)
            print(
                f"[operator_scale] {jobs} jobs: pods exist {_s(r.pods_exist_s)}, jobs Running "
                f"{_s(r.jobs_running_s)}, replacement Running p50 {_ms(r.repl_running, 50)} "
                f"p99 {_ms(r.repl_running, 99)}, peak RSS {r.peak_rss_mib:.0f} MiB, idle "
                f"{per_minute(r.idle_counts, r.idle_window_s, watches=False):.1f} req/min; "
                f"({time.monotonic() - t:.0f} s) {'; '.join(r.problems)}",
                flush=True,
            )
        text = body(results, cfg)
        print(text)
        if write:
            plot(results)
            cmd = (
                "python -m benchmarks.operator_scale"
                + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip()
            )
            report.write_section("operator_scale", "Operator scale on kwok nodes", cmd, text)
        ok = True
    finally:
        stop(proxy)
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"[operator_scale] logs kept in {work}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
