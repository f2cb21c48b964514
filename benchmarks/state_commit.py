"""What ``TrainState.commit`` costs a step, replicated and ``sharded=True`` (issue 18).

Where it sits: ``python -m benchmarks.state_commit``; not part of ``make
bench`` and writes no RESULTS.md section (it prints a table). Process level,
loopback only: ``--ranks`` real gloo ranks (subprocesses of this one, each
with its own state folder in ``/dev/shm`` and one lease file, as under
``torchflex-agent``) hold the example model of ``examples/train_stateful.py``
(16-32-1 MLP, SGD with momentum so the optimizer has state) and run
``--commits`` steps: a forward/backward, an all-reduce (the step's sync), then
``commit(step)`` timed alone, then a sleep to ``--step-time``. Once
replicated, once with ``sharded=True`` (the peer copy: own copy and previous,
a posted send to the ring successor, its receiver thread writing the
predecessor's copy). Reported per mode: the median and 90th percentile of
``commit`` over every rank, and the median as a share of the step time; for
``sharded=True`` also how long after ``commit`` began the copy was in the
successor's folder (read there by polling its header, outside the timed
``commit``).
The machine's load average is printed beside (numbers are indicative on a
shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from e2e.localproc import free_port
from torchflex_agent.fence import Lease
from torchflex_agent.shard_logic import PEER
from torchflex_agent.state_shm import CopyStore
from torchflex_contract import env as tfenv

_WARMUP = 20


def worker(commits: int, step_time: float, sharded: bool) -> None:
    """One rank (run in a subprocess): prints its commit times (seconds) as JSON."""
    import datetime

    import torch
    import torch.distributed as dist

    from torchflex_agent.state import TrainState

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    state = TrainState(model=model, opt=opt, sharded=sharded)
    state.restore()
    # Sharded: the successor's folder, to see when this rank's copy lands there.
    succ_dir = os.environ.get("BENCH_SUCCESSOR_DIR", "")
    succ = CopyStore({tfenv.STATE_DIR: succ_dir}) if sharded and succ_dir else None
    times, landed = [], []
    for step in range(1, commits + _WARMUP + 1):
        started = time.monotonic()
        x = torch.randn(32, 16)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        dist.all_reduce(torch.zeros(1))
        t0 = time.perf_counter()
        assert state.commit(step)
        if step > _WARMUP:
            times.append(time.perf_counter() - t0)
        while succ is not None and step > _WARMUP and time.perf_counter() - t0 < step_time:
            meta = succ.read_meta(PEER)
            if meta is not None and meta.step == step:
                landed.append(time.perf_counter() - t0)
                break
            time.sleep(0.0002)
        left = step_time - (time.monotonic() - started)
        if left > 0:
            time.sleep(left)
    state.close()
    dist.barrier()
    dist.destroy_process_group()
    print(json.dumps([times, landed]), flush=True)


def run_mode(
    ranks: int, commits: int, step_time: float, sharded: bool
) -> tuple[list[float], list[float]]:
    with tempfile.TemporaryDirectory(prefix="torchflex-bench-commit-", dir="/dev/shm") as tmp:
        lease = Lease(Path(tmp) / "lease", duration=3600.0)
        lease.grant(1, "bench", time.monotonic())
        port = free_port()
        procs = []
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
            cmd = [sys.executable, "-m", "benchmarks.state_commit", "--worker",
                   "--commits", str(commits), "--step-time", str(step_time)]  # fmt: skip
            if sharded:
                cmd.append("--sharded")
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
        times: list[float] = []
        landed: list[float] = []
        for p in procs:
            try:
                out, _ = p.communicate(timeout=commits * step_time * 3 + 120)
            finally:
                p.kill()
            if p.returncode != 0:
                raise SystemExit(f"a rank failed (exit {p.returncode})")
            got = json.loads(out.strip().splitlines()[-1])
            times += got[0]
            landed += got[1]
    return times, landed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ranks", type=int, default=3)
    p.add_argument("--commits", type=int, default=500)
    p.add_argument("--step-time", type=float, default=0.1)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--sharded", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args.commits, args.step_time, args.sharded)
        return
    print(f"load average before: {Path('/proc/loadavg').read_text().strip()}")
    for sharded in (False, True):
        times, landed = run_mode(args.ranks, args.commits, args.step_time, sharded)
        times.sort()
        median, p90 = statistics.median(times), times[int(len(times) * 0.9)]
        mode = "sharded=True" if sharded else "replicated"
        print(
            f"{mode:>13}: commit median {median * 1e3:.2f} ms, p90 {p90 * 1e3:.2f} ms "
            f"({len(times)} commits, {args.ranks} ranks): {median / args.step_time:.1%} "
            f"of a {args.step_time * 1e3:.0f} ms step"
        )
        if landed:
            landed.sort()
            print(
                f"{'':>13}  the copy in the successor's folder: median "
                f"{statistics.median(landed) * 1e3:.2f} ms, p90 "
                f"{landed[int(len(landed) * 0.9)] * 1e3:.2f} ms after commit began "
                f"({len(landed)} of {len(times)} within the step)"
            )
    print(f"load average after: {Path('/proc/loadavg').read_text().strip()}")


if __name__ == "__main__":
    main()
