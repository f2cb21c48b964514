"""A tiny elastic training job: DDP on synthetic data with checkpoint and resume.

Where it sits: the example the agent's integration tests and the e2e
scenarios run (``torchflex-agent ... -- python examples/train_elastic.py``);
it also runs unchanged under plain ``torchrun``. It shows what an elastic
script needs: init from the env torchrun/torchflex set, resume from the
latest checkpoint, checkpoint through ``torchflex_agent.checkpoint`` (atomic,
never behind the checkpoint on disk, refused once the agent fenced this
member off), report each step to the agent (``torchflex_agent.progress``: the
job's training progress), and on SIGTERM finish the current step, save and
exit 0. All ranks stop at the same step because the stop flag is all-reduced
every step.

Prints one line per step: ``step=N loss=X world=W rank=R sps=S``; with
``--print-time`` (or ``TRAIN_PRINT_TIME=1``) the line ends with `` t=<unix time>``
of the step's completion, which the recovery benchmarks parse.
``--no-sigterm-hook`` (``TRAIN_NO_SIGTERM_HOOK=1``) leaves SIGTERM's default
action in place (the process dies, only periodic checkpoints survive): the
preemption benchmark's "without the hook" case.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import sys
import time
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel

from torchflex_agent.checkpoint import Checkpointer
from torchflex_agent.progress import report_step


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=int(os.environ.get("TRAIN_STEPS", "100")))
    p.add_argument("--step-time", type=float, default=float(os.environ.get("STEP_TIME", "0.1")))
    p.add_argument("--ckpt-dir", default=os.environ.get("CKPT_DIR", ""))
    p.add_argument("--ckpt-every", type=int, default=int(os.environ.get("CKPT_EVERY", "10")))
    p.add_argument(
        "--print-time",
        action="store_true",
        default=os.environ.get("TRAIN_PRINT_TIME", "") == "1",
        help="append t=<unix time> to every step line",
    )
    p.add_argument(
        "--no-sigterm-hook",
        action="store_true",
        default=os.environ.get("TRAIN_NO_SIGTERM_HOOK", "") == "1",
        help="do not catch SIGTERM (no checkpoint on preemption)",
    )
    return p.parse_args()


def load_checkpoint(ckpt: Checkpointer | None) -> dict[str, Any] | None:
    state: dict[str, Any] | None = ckpt.load() if ckpt is not None else None
    return state


def save_checkpoint(
    ckpt: Checkpointer | None, step: int, model: nn.Module, opt: torch.optim.Optimizer
) -> None:
    if ckpt is None:
        return
    if ckpt.save(step, {"model": model.state_dict(), "opt": opt.state_dict()}):
        print(f"checkpoint step={step}", flush=True)
    else:
        # Worded so log parsers that count "checkpoint step=N" never count it.
        print(f"save refused at step {step}: fenced or behind the checkpoint on disk", flush=True)


@record
def main() -> int:
    args = parse_args()
    stop_requested = False

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        nonlocal stop_requested
        stop_requested = True

    if not args.no_sigterm_hook:
        signal.signal(signal.SIGTERM, on_sigterm)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    done = 0
    ckpt = Checkpointer(args.ckpt_dir) if args.ckpt_dir else None
    state = load_checkpoint(ckpt)
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        done = int(state["step"])
        print(f"resumed from step={done}", flush=True)
    ddp = DistributedDataParallel(model)
    try:
        while done < args.steps:
            started = time.monotonic()
            gen = torch.Generator().manual_seed(done * 1000 + rank)
            x = torch.randn(32, 16, generator=gen).to(device)
            y = x.sum(dim=1, keepdim=True)
            loss = nn.functional.mse_loss(ddp(x), y)
            opt.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]  # DDP all-reduces here
            opt.step()
            done += 1  # the model now holds exactly `done` steps
            flag = torch.tensor([1.0 if stop_requested else 0.0], device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            left = args.step_time - (time.monotonic() - started)
            if left > 0:
                time.sleep(left)
            sps = 1.0 / max(time.monotonic() - started, 1e-6)
            stamp = f" t={time.time():.3f}" if args.print_time else ""
            line = f"step={done} loss={loss.item():.4f} world={world} rank={rank} sps={sps:.1f}"
            print(line + stamp, flush=True)
            report_step(done)  # the job's status shows it (docs/agent.md); cheap every step
            stopping = flag.item() > 0
            if rank == 0 and (stopping or done % args.ckpt_every == 0 or done == args.steps):
                save_checkpoint(ckpt, done, model, opt)
            if stopping:
                print(f"stopping at step={done} on SIGTERM", flush=True)
                break
    except RuntimeError:
        # A peer vanished mid-collective. Replicas are identical after every
        # completed step, so rank 0 saves what it has before failing.
        if rank == 0:
            save_checkpoint(ckpt, done, model, opt)
        raise
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
