"""An unchanged-style DDP/gloo training script with a staged fault that leaves every
process alive, for the hang tests (issue 28).

``STALL_AT=<step>`` with ``STALL_RANK=<r>``: in the first run only (no restart
yet), rank r stops taking part at that step: it sleeps in its own code while
its process stays alive, and the others block in their next all-reduce.
``EVAL_AT=<step>`` with ``EVAL_SECONDS=<s>``: rank 0 runs an "evaluation" of s
seconds inside ``pulse.paused`` while the others wait in a barrier (must not
be called a hang); with ``EVAL_UNDECLARED=1`` the same wait is not declared.
``WIDTH`` and ``STEP_SLEEP`` make each step compute-bound (the straggler test).
Nothing else in the script knows about torchflex: the agent sees its steps
through the fork server's hooks.
"""

from __future__ import annotations

import datetime
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def stalled_in_user_code() -> None:
    """A rank alive but stuck (a deadlock, a data loader that never returns)."""
    print(f"rank {dist.get_rank()}: stopping to take part", flush=True)
    while True:
        time.sleep(1.0)


def evaluate(seconds: float) -> None:
    from torchflex_agent.pulse import paused

    if os.environ.get("EVAL_UNDECLARED"):
        print("rank 0: evaluating (undeclared)", flush=True)
        time.sleep(seconds)
        return
    with paused("evaluation", max_seconds=seconds + 30):
        print("rank 0: evaluating", flush=True)
        time.sleep(seconds)


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    stall_at = int(os.environ.get("STALL_AT", "-1")) if restart == 0 else -1
    stall_rank = int(os.environ.get("STALL_RANK", "-1"))
    eval_at = int(os.environ.get("EVAL_AT", "-1"))
    eval_s = float(os.environ.get("EVAL_SECONDS", "0"))
    steps = int(os.environ.get("STEPS", "60"))
    width = int(os.environ.get("WIDTH", "16"))
    pause = float(os.environ.get("STEP_SLEEP", "0.05"))
    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.ReLU(), torch.nn.Linear(width, 4))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, steps + 1):
        if step == stall_at and rank == stall_rank:
            stalled_in_user_code()
        if step == eval_at:
            if rank == 0:
                evaluate(eval_s)
            dist.barrier()
        loss = model(torch.randn(max(8, width), 16)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"[rank {rank}] step {step} world {world} restart {restart}", flush=True)
        time.sleep(pause)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
