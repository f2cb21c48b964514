"""Benchmark 4: the operator at scale on kwok's fake nodes.

Where it sits: ``python -m benchmarks.operator_scale`` (also run by ``make
bench``). Uses the local control plane of ``TORCHFLEX_CLUSTER_SLOT`` (started
if needed), adds kwok nodes, and for each job count runs a fresh operator
process (``torchflex-operator`` through ``e2e.operator_proc``, its API traffic through
``benchmarks._scale_proxy`` so every request it makes is counted) in a fresh
namespace: create all jobs at once, wait for every pod and job, sit idle,
delete a fraction of the workers, wait for replacements. Watches in
``benchmarks._scale_watch`` timestamp what happens; ``_scale_stats`` holds
the arithmetic. Writes the ``operator_scale`` section of RESULTS.md and
``benchmarks/plots/operator_scale.png`` (never with ``--quick``).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from benchmarks._scale_procs import start_logged
from benchmarks._scale_report import Config, SizeResult, as_json, body, fmt_ms, fmt_s, plot
from benchmarks._scale_stats import (
    count_by,
    cpu_seconds,
    parse_log,
    per_minute,
    replacement_latencies,
    status_kib,
)
from benchmarks._scale_watch import PodSeen, Tracker
from benchmarks.cli import BenchCli
from e2e.cluster import Cluster, ensure_up
from e2e.cluster.layout import KWOK_TAINT_KEY
from e2e.localproc import free_port, stop_process
from e2e.operator_proc import OperatorProcess
from e2e.polling import poll_until
from e2e.workload import apply_crd
from torchflex_contract import labels
from torchflex_operator.model.vocabulary import Phase

TICKS = os.sysconf("SC_CLK_TCK")


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


class Operator(OperatorProcess):
    """The operator under measurement, started; read from /proc by PID.

    Its backoff is the shipped default (``tuning=()``), and kwok pod IPs are
    fake addresses off loopback and the bridge: no agent status polling.
    """

    def __init__(self, kubeconfig: Path, namespace: str, log: Path) -> None:
        super().__init__(kubeconfig, [namespace], log, ["--no-agent-status-poll"], tuning=())
        self.start()

    def cpu(self) -> float:
        return cpu_seconds(Path(f"/proc/{self.pid}/stat").read_text(), TICKS)

    def rss_mib(self, field: str) -> float:
        return status_kib(Path(f"/proc/{self.pid}/status").read_text(), field) / 1024


def wait_until(what: str, pred: Callable[[], bool], timeout: float, every: float = 0.5) -> bool:
    """``e2e.polling.poll_until``, saying so when the bound ran out (the run goes on)."""
    if poll_until(pred, timeout, every):
        return True
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
            failed = [name for name, ph in phases.items() if ph == Phase.FAILED]
            if failed:
                raise RuntimeError(f"{len(failed)} job(s) Failed, e.g. {failed[0]}; see the log")
            return (
                len(workers) >= expected
                and all(p.running is not None for p in workers)
                and len(phases) == jobs
                and all(ph == Phase.RUNNING for ph in phases.values())
            )

        if not wait_until("all pods and jobs Running", all_up, cfg.timeout_s, every=1):
            problems.append("not every pod/job reached Running within the bound")
        t_up = time.monotonic()
        cpu["create"] = op.cpu() - cpu0
        pods = [p for p in tracker.snapshot().values() if p.role == labels.PodKind.WORKER]
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
        live = [p for p in before.values() if p.role == labels.PodKind.WORKER and p.gone is None]
        victims = random.Random(cfg.seed + jobs).sample(live, max(1, int(len(live) * cfg.fraction)))
        from kubernetes import client

        core = client.CoreV1Api(api)
        deletions: dict[str, list[float]] = {}
        cpu_d0, del0 = op.cpu(), time.monotonic()
        for v in victims:
            deletions.setdefault(v.job, []).append(time.monotonic())
            # Grace 0: the pod object goes at once, as after a real kubelet
            # confirmed the stop. A graceful delete would be finished by kwok,
            # which deletes by name and then hits the replacement (see body).
            core.delete_namespaced_pod(v.name, ns, grace_period_seconds=0)

        def new_workers() -> list[PodSeen]:
            return [
                p
                for uid, p in tracker.snapshot().items()
                if uid not in before and p.role == labels.PodKind.WORKER
            ]

        def replaced() -> bool:
            # Only pods still there count: a replacement deleted again (see
            # below) has been replaced in turn, and never runs itself.
            live = [p for p in new_workers() if p.gone is None and not p.terminating]
            return len(live) >= len(victims) and all(p.running is not None for p in live)

        if not wait_until("replacements Running", replaced, cfg.timeout_s):
            problems.append("not every deleted pod was replaced within the bound")
        cpu["replace"] = op.cpu() - cpu_d0
        new = new_workers()
        lost = [p for p in new if p.gone is not None]
        if lost:
            own = count_by(parse_log(proxy_log.read_text()), del0, time.monotonic())
            op_deletes = sum(n for (verb, res), n in own.items() if verb == "delete")
            problems.append(
                f"{len(lost)} replacement pod(s) were deleted again by another client, "
                f"e.g. {lost[0].name} (the operator's own DELETEs meanwhile: {op_deletes}); "
                "the operator replaced them too"
            )
        arrivals: dict[str, list[float]] = {}
        ran: dict[str, list[float]] = {}
        for p in new:
            arrivals.setdefault(p.job, []).append(p.added)
            if p.running is not None and p.gone is None:
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
    op.stop(grace_s=15)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    cli = BenchCli("operator_scale", __doc__, quick_help="20 jobs x 4 pods, 50 nodes",
                   json_help="print one JSON object at the end, after the markdown")  # fmt: skip
    cli.add_argument("--jobs", type=int, nargs="+", help="job counts (default 20 50 100 200)")
    cli.add_argument("--pods-per-job", type=int, help="workers per job (default 16)")
    cli.add_argument("--nodes", type=int, help="kwok nodes (default 500)")
    cli.add_argument("--idle", type=float, help="idle window in seconds (default 120)")
    cli.add_argument("--settle", type=float, default=15.0, help="seconds before the idle window")
    cli.add_argument("--timeout", type=float, help="bound of each wait (s; 1200, quick 300)")
    cli.add_argument("--delete-fraction", type=float, default=0.1)
    cli.add_argument("--seed", type=int, default=7)
    bench = cli.parse(argv)
    args = bench.args
    q = bench.quick
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
    # make bench / timeout stop us with SIGTERM: unwind so the finally blocks
    # stop the operator and the proxy we started, and delete the namespace.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    cluster = ensure_up()
    apply_crd(cluster)
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
                f"[operator_scale] {jobs} jobs: pods exist {fmt_s(r.pods_exist_s)}, jobs Running "
                f"{fmt_s(r.jobs_running_s)}, replacement Running p50 {fmt_ms(r.repl_running, 50)} "
                f"p99 {fmt_ms(r.repl_running, 99)}, peak RSS {r.peak_rss_mib:.0f} MiB, idle "
                f"{per_minute(r.idle_counts, r.idle_window_s, watches=False):.1f} req/min; "
                f"({time.monotonic() - t:.0f} s) {'; '.join(r.problems)}",
                flush=True,
            )
        text = body(results, cfg)
        print(text)
        if bench.json:
            bench.print_json(as_json(results))
        if bench.write:
            plot(results)
        bench.write_section("operator_scale", "Operator scale on kwok nodes", text)
        ok = True
    finally:
        stop_process(proxy)
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"[operator_scale] logs kept in {work}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
