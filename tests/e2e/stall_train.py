"""The example's training loop with staged faults that leave every process alive.

Used by the e2e hang scenarios (issue 28). Takes the example's arguments
(``--steps --step-time --ckpt-dir --ckpt-every``) so ``e2e.workload.TrainingJob``
runs it, prints the example's lines and checkpoints like it. The script knows
nothing of hang detection: the agent sees its steps through the fork server's
hooks. Faults, from the environment:

- ``STALL_RANK`` / ``STALL_AT``: in the first run only (no restart yet), that
  rank stops taking part at that step: it sleeps in its own code, its process
  alive; the others block in their next all-reduce.
- ``EVAL_AT`` / ``EVAL_SECONDS``: at that step rank 0 "evaluates" for that long
  inside ``torchflex_agent.pulse.paused`` while the others wait in a barrier.
- ``COLLECTIVE_TIMEOUT_S``: gloo's timeout (600 s here; torch's default is 30 min),
  which is what a stuck collective waits for under a launcher without hang detection.
  ``TRAIN_PRINT_TIME=1`` ends each step line with `` t=<unix time>`` (the benchmarks).
- ``WIDTH``: a wider model and batch, so that a step is compute-bound and a
  node under a CPU quota (``e2e.throttle``) is slow (the straggler scenario).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from torchflex_agent.checkpoint import Checkpointer
from torchflex_agent.pulse import paused


def stalled_in_user_code(rank: int) -> None:
    """A rank alive but stuck (a deadlock, a data loader that never returns)."""
    print(f"rank {rank}: stopping to take part", flush=True)
    while True:
        time.sleep(1.0)


def evaluate(seconds: float) -> None:
    with paused("evaluation", max_seconds=seconds + 60):
        print(f"evaluating for {seconds:g} s", flush=True)
        time.sleep(seconds)
    print("evaluation done", flush=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--step-time", type=float, default=0.1)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--ckpt-every", type=int, default=10)
    args = p.parse_args()
    collective_s = float(os.environ.get("COLLECTIVE_TIMEOUT_S", "600"))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=collective_s))
    stamp = os.environ.get("TRAIN_PRINT_TIME") == "1"
    rank, world = dist.get_rank(), dist.get_world_size()
    first_run = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    stall_rank = int(os.environ.get("STALL_RANK", "-1"))
    stall_at = int(os.environ.get("STALL_AT", "-1")) if first_run else -1
    eval_at = int(os.environ.get("EVAL_AT", "-1"))
    eval_s = float(os.environ.get("EVAL_SECONDS", "0"))
    width = int(os.environ.get("WIDTH", "8"))  # wider: each step compute-bound
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ckpt = Checkpointer(args.ckpt_dir)
    done = 0
    state = ckpt.load()
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        done = int(state["step"])
        print(f"resumed from step={done}", flush=True)
    ddp = DistributedDataParallel(model)
    first, began = done, time.monotonic()
    while done < args.steps:
        if done + 1 == stall_at and rank == stall_rank:
            stalled_in_user_code(rank)
        if done + 1 == eval_at:
            if rank == 0:
                evaluate(eval_s)
            dist.barrier()
        started = time.monotonic()
        gen = torch.Generator().manual_seed(done * 1000 + rank)
        x = torch.randn(max(32, width), 16, generator=gen)
        loss = nn.functional.mse_loss(ddp(x), x.sum(dim=1, keepdim=True))
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        done += 1
        time.sleep(max(0.0, args.step_time - (time.monotonic() - started)))
        at = f" t={time.time():.3f}" if stamp else ""
        sps = (done - first) / max(1e-9, time.monotonic() - began)
        line = f"step={done} loss={loss.item():.4f} world={world} rank={rank} sps={sps:.2f}"
        print(line + at, flush=True)
        if rank == 0 and (done % args.ckpt_every == 0 or done == args.steps):
            state = {"model": model.state_dict(), "opt": opt.state_dict()}
            if ckpt.save(done, state):
                print(f"checkpoint step={done}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
