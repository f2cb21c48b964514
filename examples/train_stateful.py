"""The elastic example adopting the state API: resume from memory, at most one step lost.

Where it sits: ``examples/train_elastic.py`` with four lines more
(``torchflex_agent.state``): register the model and optimizer, ``restore()``
after ``init_process_group``, ``commit(step)`` after each optimizer step. Run
by ``torchflex-agent ... -- python examples/train_stateful.py``, by the state
API's integration test and by the goodput benchmark's ``torchflex-state``
launcher; it also runs unchanged under plain ``torchrun`` (no copies kept:
it resumes from its disk checkpoint as the elastic example does).

After a member's loss the agent restarts the workers (a fork from its warm
zygote); the new workers resume from the newest in-memory copy any of them
holds (a replacement gets it by broadcast), not from disk. The disk
checkpoint (``--ckpt-dir``, every ``--ckpt-every`` steps) is only read when
nobody holds a copy: the job's first start, or every node lost at once.

Prints one line per step: ``step=N loss=X world=W rank=R sps=S`` (`` t=<unix
time>`` with ``--print-time``), printed after the step's copy was kept, so a
printed step is never lost; and on every start ``restored step=N from=local``
(each rank loaded its node's copy), ``restored step=N from=rank K`` (broadcast),
``resumed from step=N`` (disk) or nothing (fresh start).
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import sys
import threading
import time
from types import FrameType

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel

from torchflex_agent.checkpoint import Checkpointer
from torchflex_agent.progress import report_step
from torchflex_agent.state import TrainState


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=int(os.environ.get("TRAIN_STEPS", "100")))
    p.add_argument("--step-time", type=float, default=float(os.environ.get("STEP_TIME", "0.1")))
    p.add_argument("--ckpt-dir", default=os.environ.get("CKPT_DIR", ""))
    p.add_argument("--ckpt-every", type=int, default=int(os.environ.get("CKPT_EVERY", "100")))
    p.add_argument(
        "--print-time",
        action="store_true",
        default=os.environ.get("TRAIN_PRINT_TIME", "") == "1",
        help="append t=<unix time> to every step line",
    )
    return p.parse_args()


def resume(state: TrainState, ckpt: Checkpointer | None) -> int:
    """The step to continue after: memory first (every rank agrees), disk only if nobody
    holds a copy, else 0."""
    got = state.restore()
    if got is not None:
        where = f"rank {got.source}" if got.broadcast else "local"
        print(f"restored step={got.step} from={where} round={got.meta.round}", flush=True)
        return got.step
    saved = ckpt.load() if ckpt is not None else None
    if saved is None:
        return 0
    for name, obj in state.objects.items():
        obj.load_state_dict(saved[name])
    print(f"resumed from step={saved['step']}", flush=True)
    return int(saved["step"])


@record
def main() -> int:
    args = parse_args()
    # An Event, not a flag: SIGTERM also ends the step's pacing sleep at once, so
    # a re-forming group's workers exit without sleeping out the step first.
    stop_requested = threading.Event()

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        stop_requested.set()

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
    state = TrainState(model=model, opt=opt)  # the state API: what a step changes
    ckpt = Checkpointer(args.ckpt_dir) if args.ckpt_dir else None
    done = resume(state, ckpt)
    ddp = DistributedDataParallel(model)
    while done < args.steps:
        started = time.monotonic()
        gen = torch.Generator().manual_seed(done * 1000 + rank)
        x = torch.randn(32, 16, generator=gen).to(device)
        y = x.sum(dim=1, keepdim=True)
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]  # DDP all-reduces here
        opt.step()
        done += 1
        state.commit(done)  # the step is complete: keep it in the agent's memory
        flag = torch.tensor([1.0 if stop_requested.is_set() else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        left = args.step_time - (time.monotonic() - started)
        if left > 0:
            stop_requested.wait(left)
        sps = 1.0 / max(time.monotonic() - started, 1e-6)
        stamp = f" t={time.time():.3f}" if args.print_time else ""
        line = f"step={done} loss={loss.item():.4f} world={world} rank={rank} sps={sps:.1f}"
        print(line + stamp, flush=True)
        report_step(done)
        stopping = flag.item() > 0
        if ckpt is not None and rank == 0 and (stopping or done % args.ckpt_every == 0):
            payload = {name: obj.state_dict() for name, obj in state.objects.items()}
            if ckpt.save(done, payload):
                print(f"checkpoint step={done}", flush=True)
        if stopping:
            print(f"stopping at step={done} on SIGTERM", flush=True)
            break
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
