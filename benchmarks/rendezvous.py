"""Benchmark 2: rendezvous latency vs number of agents, torchflex vs torch.

Where it sits: ``python -m benchmarks.rendezvous`` (also run by ``make
bench``). Needs no cluster: it starts a ``torchflex-agent store`` (TCPStore
server) and an etcd (the pinned build) on 127.0.0.1, plus a few member-hosting
processes (``benchmarks._rdzv_host``), and drives trials through them. The
latency definition lives in ``benchmarks._rdzv_stats``. Writes the
``rendezvous`` section of ``benchmarks/RESULTS.md`` and
``benchmarks/plots/rendezvous.png`` (not with ``--quick``).
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import _rdzv_roles, report
from benchmarks._rdzv_host import SYSTEMS
from benchmarks._rdzv_stats import MemberResult, TrialOutcome, evaluate_roles, split_members
from benchmarks._scale_procs import REPO, start_logged, wait_line
from benchmarks.cli import BenchCli
from e2e.localproc import free_port, pinned_binary, stop_process

SIZES: tuple[int, ...] = (2, 4, 8, 16, 32, 64, 128)
# torch-c10d is not run above this N (``--sizes ... 1024``); why: ``_large_n_note``.
TORCH_MAX_N = 128
QUICK_SIZES: tuple[int, ...] = (2, 8, 32)
TARGET_S = 0.5
TARGET_N = 64
# Members are released this long after the last host said ready, so every
# host is sleeping on the same deadline when it passes.
_RELEASE_LEAD_S = 0.3
# Above TORCH_MAX_N a torchflex-c10d member's per-call deadline, in place of the
# agent's 2 s: the etcd backend's default request timeout. N clients share this
# machine's 2 cores there, and their own CPU, not the store, is what is late
# (the section records the store's CPU per trial); why: ``_large_n_note``.
LARGE_N_OP_TIMEOUT_S = 10.0
# The resolver the store and the hosts run with (see ``loopback_resolver``).
_RESOLV_CONF = "nameserver 127.0.0.1\noptions attempts:1 timeout:1\n"


def loopback_resolver(cmd: list[str], work: Path) -> list[str]:
    """``cmd`` run with its /etc/resolv.conf pointing at loopback, as the store pod's is.

    torch's TCPStore looks up every peer's name (server: each accepted client;
    client: its server) and the operator's store pod answers those at once
    from a loopback resolver (``backends.STORE_DNS``). Here a private mount
    namespace gives the process that resolver, so no lookup leaves the
    machine. Unchanged (``cmd``) where that needs privileges we lack.
    """
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or unshare is None:
        return cmd
    conf = work / "resolv.conf"
    conf.write_text(_RESOLV_CONF)
    script = 'mount --bind "$0" /etc/resolv.conf && exec "$@"'
    return [unshare, "--mount", "--", "sh", "-c", script, str(conf), *cmd]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Host:
    """One member-hosting process and a thread reading its JSON replies."""

    def __init__(self, log_path: Path, work: Path | None = None) -> None:
        self._log = log_path.open("w")
        cmd = [sys.executable, "-m", "benchmarks._rdzv_host"]
        self.proc = subprocess.Popen(
            cmd if work is None else loopback_resolver(cmd, work),
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        self.replies: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.replies.put(json.loads(line))

    def send(self, obj: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def reply(self, timeout: float) -> dict[str, Any]:
        try:
            return self.replies.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"host {self.proc.pid}: no reply in {timeout:.0f}s") from None

    def close(self) -> None:
        if self.proc.poll() is None and self.proc.stdin is not None:
            try:
                self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
                self.proc.stdin.close()
            except OSError:
                pass
        stop_process(self.proc, grace=10)
        self._log.close()


def run_trial(
    hosts: Sequence[Host], system: str, n: int, port: int, timeout: float, *, roles: int = 1
) -> TrialOutcome:
    """One trial of ``n`` members, one role of ``n`` or ``roles`` Independent roles."""
    counts = split_members(n, len(hosts))
    run_id = f"bench-{uuid.uuid4().hex[:10]}"
    used = hosts[: len(counts)]
    op_timeout = LARGE_N_OP_TIMEOUT_S if n > TORCH_MAX_N else None
    first = 0
    for host, count in zip(used, counts, strict=True):
        host.send(
            {"op": "prepare", "system": system, "run_id": run_id, "n": n, "count": count,
             "port": port, "timeout": timeout, "op_timeout": op_timeout, "roles": roles,
             "first": first}
        )  # fmt: skip
        first += count
    for host in used:
        host.reply(60 + n)
    at = time.monotonic() + _RELEASE_LEAD_S
    for host in used:
        host.send({"op": "go", "at": at, "timeout": timeout})
    members: list[MemberResult] = []
    for host in used:
        raw = host.reply(timeout + 60)
        members += [MemberResult.from_json(m) for m in raw["members"]]
    for host in used:
        host.send({"op": "close"})
    for host in used:
        host.reply(60 + n)
    return evaluate_roles(n, roles, members)


def measure(
    hosts: Sequence[Host],
    *,
    ports: dict[str, int],
    systems: Sequence[str],
    sizes: Sequence[int],
    reps: int,
    timeout: float,
    store_pid: int | None = None,
    store_cpu: dict[int, list[float]] | None = None,
) -> dict[tuple[str, int], list[TrialOutcome]]:
    """Interleaved: each repetition runs every (size, system), rotating the system order.

    ``store_cpu``, if given, gets the CPU seconds the store process (``store_pid``)
    used in each torchflex-c10d trial, by N.
    """
    out: dict[tuple[str, int], list[TrialOutcome]] = {(s, n): [] for s in systems for n in sizes}
    for rep in range(reps):
        for i, n in enumerate(sizes):
            k = (rep + i) % len(systems)
            for system in [*systems[k:], *systems[:k]]:
                if system == "torch-c10d" and n > TORCH_MAX_N:
                    continue
                before = cpu_seconds(store_pid) if store_pid else 0.0
                outcome = run_trial(hosts, system, n, ports[system], timeout)
                if store_pid and store_cpu is not None and system == "torchflex-c10d":
                    store_cpu.setdefault(n, []).append(cpu_seconds(store_pid) - before)
                out[(system, n)].append(outcome)
                shown = (
                    "FAILED: " + str(outcome.problem)
                    if outcome.latency is None
                    else (f"{outcome.latency * 1000:.0f} ms")
                )
                print(f"[rendezvous] rep {rep + 1}/{reps} n={n:>3} {system:<15} {shown}",
                      flush=True)  # fmt: skip
    return out


def _cell(trials: Sequence[TrialOutcome]) -> str:
    if not trials:
        return "not run"
    ok = [t.latency for t in trials if t.latency is not None]
    failed = len(trials) - len(ok)
    text = report.summarize([v * 1000 for v in ok]).fmt("ms", 0)
    return text + (f", {failed} failed" if failed else "")


def _ratio(base: Sequence[TrialOutcome], ours: Sequence[TrialOutcome]) -> str:
    b = [t.latency for t in base if t.latency is not None]
    o = [t.latency for t in ours if t.latency is not None]
    if not b or not o:
        return "n/a"
    return f"{report.summarize(b).median / report.summarize(o).median:.1f}x"


def plot(results: dict[tuple[str, int], list[TrialOutcome]], sizes: Sequence[int]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for system in SYSTEMS:
        xs, med, lo, hi = [], [], [], []
        for n in sizes:
            vals = [t.latency for t in results.get((system, n), []) if t.latency is not None]
            if vals:
                s = report.summarize(vals)
                xs.append(n)
                med.append(s.median)
                lo.append(s.median - s.low)
                hi.append(s.high - s.median)
        if xs:
            ax.errorbar(xs, med, yerr=[lo, hi], marker="o", capsize=3, label=system)
    ax.axhline(TARGET_S, color="grey", linestyle="--", linewidth=1, label="target 0.5 s")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(list(sizes), [str(n) for n in sizes])
    ax.set_xlabel("agents joining at once (min = max = N)")
    ax.set_ylabel("last join -> every agent ranked (s)")
    ax.set_title("Rendezvous latency (median, min-max bars)")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    return report.save_figure(fig, "rendezvous")


def body(
    results: dict[tuple[str, int], list[TrialOutcome]],
    sizes: Sequence[int],
    reps: int,
    procs: int,
    etcd_note: str,
    *,
    load: str = "not recorded.",
    store_cpu: dict[int, list[float]] | None = None,
    resolver: str = "",
) -> str:
    header = ["N", *SYSTEMS, "torch / torchflex-c10d", "torch / torchflex-etcd"]
    rows = []
    for n in sizes:
        torch_trials = results.get(("torch-c10d", n), [])
        rows.append(
            [str(n)]
            + [_cell(results.get((s, n), [])) for s in SYSTEMS]
            + [
                _ratio(torch_trials, results.get(("torchflex-c10d", n), [])),
                _ratio(torch_trials, results.get(("torchflex-etcd", n), [])),
            ]
        )
    medians = []
    for system in ("torchflex-c10d", "torchflex-etcd"):
        done = [t.latency for t in results.get((system, TARGET_N), []) if t.latency]
        if done:
            medians.append(f"{system} median {report.summarize(done).median:.3f} s")
    verdict = f"Target: < {TARGET_S} s at N={TARGET_N}" + (
        f"; {', '.join(medians)}." if medians else " (not measured in this run)."
    )
    return f"""
Latency from the last join to every agent holding its rank, {reps} repetitions
per cell, median (min-max) in milliseconds. {verdict}

{report.markdown_table(header, rows)}

![rendezvous latency vs N](plots/rendezvous.png)

What is measured. N members join one rendezvous at once with min = max = N.
A member is one agent's rendezvous client: its own store connection (its
own TCPStore client, or its own etcd HTTP session) and its own rendezvous
object, the same call the agent makes (`Rendezvous.next_round` for
torchflex, `DynamicRendezvousHandler.next_rendezvous` for torch), no
workers. Members are threads hosted in min(N, {procs}) long-lived processes
(`benchmarks/_rdzv_host.py`; up to N = {procs} each member is its own
process), the same hosting for every system. Each host parks its members
on an event and releases them at one monotonic deadline; each member
stamps `start` just before its join call and `done` just after it returns
its rank. Latency = max(done) - max(start) ("from the last join"). A trial
counts only if the members formed one group with ranks 0..N-1 and world
size N. Systems are interleaved within every repetition (rotating order),
with a fresh run id per trial.

Backends. `torchflex-c10d` and `torch-c10d` share one TCPStore server (the
`torchflex-agent store` process, libuv). `torchflex-etcd` uses the pinned
etcd built by `e2e/toolchain/build.sh` (default fsync, as the operator's
managed etcd pod runs it), through `EtcdKVStore` (etcd v3 JSON gateway).
torch's `DynamicRendezvousHandler` runs with `C10dRendezvousBackend` on a
TCPStore client, default timeouts (its last call does not apply with
min = max), `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` (no second store on
rank 0; torchflex never starts one). Its round-0 join includes torch's own
random 0-0.3 s start delay and its 1 s polling while the round fills.
{resolver}
{_large_n_note(sizes, procs, store_cpu or {})}
Load. {load}

torch's etcd-v2 backend was not run: {etcd_note}
"""


def _large_n_note(sizes: Sequence[int], procs: int, store_cpu: dict[int, list[float]]) -> str:
    large = max(sizes)
    if large <= TORCH_MAX_N:
        return ""
    cpu = ", ".join(
        f"N = {n}: {report.summarize(v).fmt('s', 2)}"
        for n, v in sorted(store_cpu.items())
        if n > TORCH_MAX_N and v
    )
    return f"""torch-c10d is not run above N = {TORCH_MAX_N} ("not run"): its handler
rewrites one shared state blob per join and polls it every second, and at
N = {large} that would take most of the run's time on this 2-core machine; the
N = {large} row is for torchflex's two backends. There each of the {procs}
host processes runs {-(-large // procs)} member threads, each with its own store
connection (a TCPStore client with its call thread, or an etcd HTTP connection).
Above N = {TORCH_MAX_N} a torchflex-c10d member's per-call deadline is
{LARGE_N_OP_TIMEOUT_S:g} s (the etcd backend's default request timeout) instead
of the agent's 2 s: the N clients' own Python shares these 2 cores (each agent
has a machine of its own in a job), and with 2 s calls missed their deadline
while the store sat idle. Store process CPU per torchflex-c10d trial:
{cpu or "not measured"}.
"""


def _resolver_note(loopback: bool) -> str:
    if not loopback:
        return """Resolver. The machine's own: this run lacked the privileges for a private
mount namespace, so torch's reverse lookups of each peer went to its DNS server.
"""
    return """Resolver. The store and the hosts run with a loopback /etc/resolv.conf (a
private mount namespace): torch's TCPStore looks up each peer's name on every
connect, and the operator's store pod has this resolver (`backends.STORE_DNS`),
so a lookup fails at once and nothing leaves the machine.
"""


def _v2_status(client_port: int) -> str:
    """HTTP status of etcd's v2 keys API on the running etcd (loopback)."""
    import urllib.error
    import urllib.request

    url = f"http://127.0.0.1:{client_port}/v2/keys/"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return str(resp.status)
    except urllib.error.HTTPError as exc:
        return str(exc.code)
    except OSError as exc:
        return f"unreachable ({exc})"


def _etcd_v2_note(etcd: str, client_port: int) -> str:
    """Checks, on the pinned etcd, whether torch's etcd-v2 backend could run at all."""
    out = subprocess.run(
        [etcd, "--version"], check=False, capture_output=True, text=True, timeout=30
    )
    version = out.stdout.splitlines()[0].replace(" Version:", "") if out.stdout else "etcd ?"
    probe = subprocess.run(
        [etcd, "--enable-v2", "--version"], check=False, capture_output=True, text=True, timeout=30
    )
    flag = "flag provided but not defined" in (probe.stdout + probe.stderr)
    try:
        import etcd as _python_etcd  # type: ignore[import-not-found]  # noqa: F401

        client = "python-etcd is installed"
    except ImportError:
        client = "torch's backend also needs the `python-etcd` client, which is not installed"
    flag_text = (
        'rejects `--enable-v2` ("flag provided but not defined")'
        if flag
        else "accepted `--enable-v2` in this check"
    )
    status = _v2_status(client_port)
    return (
        f"the pinned {version} {flag_text}; its v2 API (removed in etcd 3.6) answers "
        f"`GET /v2/keys/` with HTTP {status} on the etcd this run started; {client}."
    )


def main(argv: list[str] | None = None) -> int:
    cli = BenchCli(
        "rendezvous",
        __doc__,
        quick_help="sizes 2, 8, 32, 2 reps",
        reps_help="repetitions per cell (default 5, quick 2)",
        json_help=None,
    )
    cli.add_argument("--sizes", type=int, nargs="+", help=f"default {' '.join(map(str, SIZES))}")
    cli.add_argument("--procs", type=int, default=8, help="member-hosting processes (default 8)")
    cli.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    cli.add_argument("--timeout", type=float, default=90.0, help="per-trial bound in seconds")
    cli.add_argument(
        "--roles",
        type=int,
        default=1,
        help="K > 1: instead of the main table, N agents as one role vs split over K "
        "Independent roles, side by side (torchflex systems; section rendezvous-roles)",
    )
    bench = cli.parse(argv)
    args = bench.args
    sizes = tuple(args.sizes or (QUICK_SIZES if bench.quick else SIZES))
    reps = bench.reps(5, quick=2)

    work = Path(tempfile.mkdtemp(prefix="tf-bench-rdzv-"))
    procs: list[subprocess.Popen[str]] = []
    hosts: list[Host] = []
    try:
        agent_bin = str(Path(sys.executable).parent / "torchflex-agent")
        store_cmd = [agent_bin, "store", "--host", "127.0.0.1", "--port", "0"]
        store = start_logged(loopback_resolver(store_cmd, work), work / "store.log")
        procs.append(store)
        line = wait_line(work / "store.log", "listening on", 60)
        store_port = int(line.rsplit(":", 1)[1])
        etcd = pinned_binary("etcd")
        client, peer = free_port(), free_port()
        etcd_proc = start_logged(
            [etcd, "--name", "bench", "--data-dir", str(work / "etcd"),
             "--listen-client-urls", f"http://127.0.0.1:{client}",
             "--advertise-client-urls", f"http://127.0.0.1:{client}",
             "--listen-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-cluster", f"bench=http://127.0.0.1:{peer}"],
            work / "etcd.log",
        )  # fmt: skip
        procs.append(etcd_proc)
        wait_line(work / "etcd.log", "serving client traffic", 60)
        ports = {"torchflex-c10d": store_port, "torch-c10d": store_port, "torchflex-etcd": client}
        hosts = [Host(work / f"host-{i}.log", work) for i in range(min(args.procs, max(sizes)))]
        if args.roles > 1:
            tried = [s for s in args.systems if s in _rdzv_roles.SYSTEMS]

            def trial(system: str, n: int, roles: int) -> TrialOutcome:
                return run_trial(hosts, system, n, ports[system], args.timeout, roles=roles)

            return _rdzv_roles.run(bench, trial, systems=tried, sizes=sizes, reps=reps,
                                   roles=args.roles, procs=args.procs)  # fmt: skip
        store_cpu: dict[int, list[float]] = {}
        load_before = os.getloadavg()[0]
        t0 = time.monotonic()
        results = measure(
            hosts, ports=ports, systems=args.systems, sizes=sizes, reps=reps,
            timeout=args.timeout, store_pid=store.pid, store_cpu=store_cpu,
        )  # fmt: skip
        print(f"[rendezvous] measured in {time.monotonic() - t0:.0f} s", flush=True)
        note = _etcd_v2_note(etcd, client)
        load = report.load_note(load_before, os.getloadavg()[0])
        resolver = _resolver_note(loopback_resolver(store_cmd, work) != store_cmd)
        text = body(results, sizes, reps, args.procs, note, load=load, store_cpu=store_cpu,
                    resolver=resolver)  # fmt: skip
        print(text)
        if bench.write:
            plot(results, sizes)
        bench.write_section("rendezvous", "Rendezvous latency vs agents", text)
    finally:
        for host in hosts:
            host.close()
        for proc in reversed(procs):
            stop_process(proc)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
