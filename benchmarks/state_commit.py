"""The state API's step-time overhead: the whole step with and without ``TrainState`` (issue 18).

Where it sits: ``python -m benchmarks.state_commit`` (part of ``make bench``,
section ``state_commit`` of RESULTS.md, common flags of :mod:`benchmarks.cli`;
the report is :mod:`benchmarks._commit_report`'s). Process level, loopback
only: ``--ranks`` real gloo ranks (subprocesses of this one, each with its own
state folder in ``/dev/shm`` and one lease file, as under ``torchflex-agent``)
hold the example model of ``examples/train_stateful.py`` (16-32-1 MLP, SGD
with momentum so the optimizer has state) and run ``--steps`` steps after a
warm-up: a forward/backward, an all-reduce (the step's sync), ``commit(step)``
where the mode has one, then a FIXED ``time.sleep(--step-time)`` standing in
for the example's work (never a sleep to a deadline, so whatever the state API
adds, its receiver thread's CPU and GIL time included, lengthens the step).
Three modes: ``baseline`` (no state API at all), ``replicated`` and
``sharded`` (``sharded=True``: own copy and previous, a posted send to the
ring successor, its receiver thread writing the predecessor's copy). Each
rank times the whole step; per mode the report gives the median and 90th
percentile step over every rank and step, the overhead against the
baseline's median step, ``commit``'s own time, and for ``sharded`` how long
after ``commit`` began the copy was in the successor's folder (polled there
on every ``PROBE_EVERY``-th step only; that step and the next are left out
of the step times, so the polling does not count as overhead).

Fairness on a shared machine: the modes run one after another in ``--reps``
rounds, the order rotated each round (round 0: baseline, replicated,
sharded; round 1: replicated, sharded, baseline; ...), so a slow spell falls
on every mode rather than on one; the per-round overheads are shown beside
the pooled figure. The load average before and after goes in the section.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks import _commit_report as rep
from benchmarks.cli import BenchCli, positive_float, positive_int
from benchmarks.report import load_note
from e2e.localproc import free_port
from torchflex_agent.fence import Lease
from torchflex_agent.memstate.logic.shards import PEER
from torchflex_agent.memstate.shm import CopyStore
from torchflex_contract import env as tfenv

_WARMUP = 20
# sharded: every PROBE_EVERY-th step polls the successor's folder for the copy;
# that step and the next (its ranks re-align at the next all-reduce) are not timed.
PROBE_EVERY = 10


def _timed(step: int) -> bool:
    """Whether a step's time counts: after the warm-up, not a probe step nor the one after."""
    return step > _WARMUP and step % PROBE_EVERY not in (0, 1)


def worker(mode: str, steps: int, step_time: float) -> None:
    """One rank (run in a subprocess): prints what it measured (seconds) as one JSON object."""
    import datetime

    import torch
    import torch.distributed as dist

    from torchflex_agent.state import TrainState

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    state = None
    if mode != rep.BASELINE:
        state = TrainState(model=model, opt=opt, sharded=mode == rep.SHARDED)
        state.restore()
    # Sharded: the successor's folder, to see when this rank's copy lands there.
    succ_dir = os.environ.get("BENCH_SUCCESSOR_DIR", "")
    succ = CopyStore({tfenv.STATE_DIR: succ_dir}) if mode == rep.SHARDED and succ_dir else None
    step_times: list[float] = []
    commits: list[float] = []
    landed: list[float] = []
    probes = 0
    for step in range(1, steps + _WARMUP + 1):
        started = time.perf_counter()
        x = torch.randn(32, 16)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        dist.all_reduce(torch.zeros(1))
        if state is not None:
            t0 = time.perf_counter()
            assert state.commit(step)
            if _timed(step):
                commits.append(time.perf_counter() - t0)
            if succ is not None and step > _WARMUP and step % PROBE_EVERY == 0:
                probes += 1
                # Bounded by one step time: a copy later than that is counted as not seen.
                while time.perf_counter() - t0 < step_time:
                    meta = succ.read_meta(PEER)
                    if meta is not None and meta.step == step:
                        landed.append(time.perf_counter() - t0)
                        break
                    time.sleep(0.0002)
        time.sleep(step_time)
        if _timed(step):
            step_times.append(time.perf_counter() - started)
    if state is not None:
        state.close()
    dist.barrier()
    dist.destroy_process_group()
    got = {"steps": step_times, "commits": commits, "landed": landed, "probes": probes}
    print(json.dumps(got), flush=True)


def run_mode(ranks: int, steps: int, step_time: float, mode: str, rnd: int) -> rep.Sample:
    """One mode's run: ``ranks`` fresh worker processes, their measurements pooled."""
    sample = rep.Sample(mode, rnd)
    with tempfile.TemporaryDirectory(prefix="torchflex-bench-commit-", dir="/dev/shm") as tmp:
        lease = Lease(Path(tmp) / "lease", duration=3600.0)
        lease.grant(1, "bench", time.monotonic())
        port = free_port()
        procs: list[subprocess.Popen[str]] = []
        try:
            for rank in range(ranks):
                folder = Path(tmp) / f"rank-{rank}"
                folder.mkdir()
                env = dict(os.environ)
                env.update({
                    "RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": str(ranks),
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                    tfenv.STATE_DIR: str(folder), tfenv.FENCE_FILE: str(lease.path),
                    tfenv.ROUND: "1",
                    "BENCH_SUCCESSOR_DIR": str(Path(tmp) / f"rank-{(rank + 1) % ranks}"),
                })  # fmt: skip
                cmd = [sys.executable, "-m", "benchmarks.state_commit", "--worker", mode,
                       str(steps), str(step_time)]  # fmt: skip
                procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
            # Bounded: three times the loop's sleeps plus the ranks' start (torch import).
            deadline = time.monotonic() + (steps + _WARMUP) * step_time * 3 + 120
            for proc in procs:
                out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
                if proc.returncode != 0:
                    raise SystemExit(f"{mode}: a rank failed (exit {proc.returncode})")
                got = json.loads(out.strip().splitlines()[-1])
                sample.steps += got["steps"]
                sample.commits += got["commits"]
                sample.landed += got["landed"]
                sample.probes += got["probes"]
        finally:
            for proc in procs:  # only the ranks this run started, each by its own handle
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=10)
    return sample


def order(rnd: int, modes: Sequence[str]) -> list[str]:
    """Round ``rnd``'s order of the modes: rotated by one each round."""
    k = rnd % len(modes)
    return [*modes[k:], *modes[:k]]


def _worker_main(argv: Sequence[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.state_commit --worker")
    p.add_argument("mode", choices=rep.MODES)
    p.add_argument("steps", type=int)
    p.add_argument("step_time", type=float)
    args = p.parse_args(argv)
    worker(args.mode, args.steps, args.step_time)


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if given[:1] == ["--worker"]:
        _worker_main(given[1:])
        return 0
    cli = BenchCli("state_commit", __doc__, quick_help="1 round of 40 steps per mode",
                   reps_help="rounds, each running every mode once (default 3)")  # fmt: skip
    cli.add_subset("--modes", rep.MODES)
    cli.add_argument("--ranks", type=positive_int, default=3, help="gloo ranks (default 3)")
    cli.add_argument("--steps", type=positive_int, default=None,
                     help=f"steps per mode and round after a warm-up of {_WARMUP}; every "
                          f"{PROBE_EVERY}th and the one after are not timed "
                          "(default 200; 40 with --quick)")  # fmt: skip
    cli.add_argument("--step-time", type=positive_float, default=0.1,
                     help="the fixed sleep standing in for the work, s (default 0.1)")  # fmt: skip
    bench = cli.parse(given)
    a = bench.args
    steps = a.steps if a.steps is not None else (40 if bench.quick else 200)
    rounds = bench.reps(3)
    load_before = os.getloadavg()[0]
    samples: list[rep.Sample] = []
    for rnd in range(rounds):
        for mode in order(rnd, a.modes):
            samples.append(run_mode(a.ranks, steps, a.step_time, mode, rnd))
            print(f"[state_commit] round {rnd + 1}/{rounds}: {mode} done",
                  file=sys.stderr, flush=True)  # fmt: skip
    result = rep.summary(samples, ranks=a.ranks, step_time=a.step_time)
    body = rep.markdown(result, rounds=rounds, probe_every=PROBE_EVERY,
                        load=load_note(load_before, os.getloadavg()[0]))  # fmt: skip
    bench.write_section("state_commit", "State API: step-time overhead (process level)", body)
    bench.show(body, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
