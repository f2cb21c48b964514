"""Trains to the end, then one rank's process never ends: a teardown hang, for real.

Used by the e2e scenario "a member that would not exit" (issue 26). Takes the
example's arguments (``--steps --step-time --ckpt-dir --ckpt-every``) so
``e2e.workload.TrainingJob`` can run it, and checkpoints like the example. After
the last step and ``destroy_process_group`` the script returns normally on
every rank, but on rank ``$HANG_RANK`` an ``atexit`` handler then blocks in
libc's ``pause()``: native code the worker never leaves, as a gloo
process-group destructor joining its threads (pytorch/pytorch#75097) does.
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from torchflex_agent.checkpoint import Checkpointer


def hang_forever_in_teardown() -> None:
    print("teardown: blocking in pause()", flush=True)
    ctypes.CDLL(None).pause()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--step-time", type=float, default=0.1)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--ckpt-every", type=int, default=10)
    args = p.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 1))
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
    while done < args.steps:
        started = time.monotonic()
        x = torch.randn(32, 16, generator=torch.Generator().manual_seed(done * 1000 + rank))
        loss = nn.functional.mse_loss(ddp(x), x.sum(dim=1, keepdim=True))
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        done += 1
        time.sleep(max(0.0, args.step_time - (time.monotonic() - started)))
        print(f"step={done} loss={loss.item():.4f} world={world} rank={rank}", flush=True)
        if rank == 0 and (done % args.ckpt_every == 0 or done == args.steps):
            state = {"model": model.state_dict(), "opt": opt.state_dict()}
            if ckpt.save(done, state):
                print(f"checkpoint step={done}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    if rank == int(os.environ.get("HANG_RANK", "-1")):
        atexit.register(hang_forever_in_teardown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
