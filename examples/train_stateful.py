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
then `` round=R``, `` in place`` when the same process re-formed and, with
``--print-time``, `` t=<unix time>`` (the state is back in memory: training
resumes); ``resumed from step=N`` (disk) or nothing (fresh start).
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
from torchflex_agent.state import Restored, TrainState


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=int(os.environ.get("TRAIN_STEPS", "100")))
    p.add_argument("--step-time", type=float, default=float(os.environ.get("STEP_TIME", "0.1")))
    p.add_argument("--ckpt-dir", default=os.environ.get("CKPT_DIR", ""))
    p.add_argument("--ckpt-every", type=int, default=int(os.environ.get("CKPT_EVERY", "100")))
    p.add_argument(
        "--in-place",
        action=argparse.BooleanOptionalAction,
        default=os.environ.get("TRAIN_IN_PLACE", "1") == "1",
        help="re-create the process group in place when the agent keeps this worker",
    )
    p.add_argument(
        "--print-time",
        action="store_true",
        default=os.environ.get("TRAIN_PRINT_TIME", "") == "1",
        help="append t=<unix time> to every step and restored line",
    )
    return p.parse_args()


PG_TIMEOUT = datetime.timedelta(seconds=60)


def announce(got: Restored, how: str = "", *, print_time: bool = False) -> int:
    """Say where the state came from; with ``--print-time`` also when (the worker's wall
    clock once it holds the state again: the recovery benchmark's "resumed" figure)."""
    where = f"rank {got.source}" if got.broadcast else "local"
    stamp = f" t={time.time():.3f}" if print_time else ""
    print(f"restored step={got.step} from={where} round={got.meta.round}{how}{stamp}", flush=True)
    return got.step


def resume(state: TrainState, ckpt: Checkpointer | None, *, print_time: bool = False) -> int:
    """The step to continue after: memory first (every rank agrees), disk only if nobody
    holds a copy, else 0."""
    got = state.restore()
    if got is not None:
        return announce(got, print_time=print_time)
    saved = ckpt.load() if ckpt is not None else None
    if saved is None:
        return 0
    for name, obj in state.objects.items():
        obj.load_state_dict(saved[name])
    print(f"resumed from step={saved['step']}", flush=True)
    return int(saved["step"])


def rejoin(state: TrainState, *, print_time: bool = False) -> int:
    """Re-form in place: a new process group for the agent's next round, then the
    group's newest copy (every survivor holds it; a newcomer gets it by broadcast)."""
    got = state.reform(wait=60.0, timeout=PG_TIMEOUT)
    if got is None:
        raise RuntimeError("re-formed in place, but no member holds a copy")
    return announce(got, " in place", print_time=print_time)


def train_step(
    ddp: DistributedDataParallel,
    opt: torch.optim.Optimizer,
    state: TrainState,
    step: int,
    *,
    rank: int,
    device: torch.device,
    stop: bool,
) -> tuple[float, bool, bool]:
    """One step, kept once complete: (loss, stop, re-form). Its tensors stay in here, so
    nothing outlives a failed step that still holds the old process group."""
    gen = torch.Generator().manual_seed((step - 1) * 1000 + rank)
    x = torch.randn(32, 16, generator=gen).to(device)
    y = x.sum(dim=1, keepdim=True)
    loss = nn.functional.mse_loss(ddp(x), y)
    opt.zero_grad()
    loss.backward()  # type: ignore[no-untyped-call]  # DDP all-reduces here
    opt.step()
    state.commit(step)  # the step is complete: keep it in the agent's memory
    # One all-reduce for both flags: SIGTERM anywhere, and a new round formed
    # around us (a member joined or left), which every rank must leave together.
    flag = torch.tensor([float(stop), float(state.reform_due())], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return loss.item(), flag[0].item() > 0, flag[1].item() > 0


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
    dist.init_process_group(backend, timeout=PG_TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # The state API: what a step changes, kept after every step.
    state = TrainState(model=model, opt=opt, in_place=args.in_place)
    ckpt = Checkpointer(args.ckpt_dir) if args.ckpt_dir else None
    done = resume(state, ckpt, print_time=args.print_time)
    ddp = DistributedDataParallel(model)
    while done < args.steps:
        started = time.monotonic()
        try:
            loss, stopping, regroup = train_step(
                ddp, opt, state, done + 1, rank=rank, device=device, stop=stop_requested.is_set()
            )
        except RuntimeError:  # DistError, or gloo's "Connection closed by peer"
            if not state.kept():
                raise  # the restart path (or a real error): the agent starts new workers
            loss, stopping, regroup = None, False, True  # the step in flight is lost
        if state.in_place and stopping and not stop_requested.is_set():
            # A peer is leaving (its SIGTERM, not ours): re-form without it instead of
            # stopping with it -- unless our agent does not keep us (it leaves too).
            stopping, regroup = False, True
        if regroup and loss is not None and not state.kept():
            stopping, regroup = True, False
        if loss is not None:
            done += 1
            left = args.step_time - (time.monotonic() - started)
            if left > 0:
                stop_requested.wait(left)
            sps = 1.0 / max(time.monotonic() - started, 1e-6)
            stamp = f" t={time.time():.3f}" if args.print_time else ""
            line = f"step={done} loss={loss:.4f} world={world} rank={rank} sps={sps:.1f}"
            print(line + stamp, flush=True)
            report_step(done)
            if ckpt is not None and rank == 0 and (stopping or done % args.ckpt_every == 0):
                payload = {name: obj.state_dict() for name, obj in state.objects.items()}
                if ckpt.save(done, payload):
                    print(f"checkpoint step={done}", flush=True)
        if stopping:
            print(f"stopping at step={done} on SIGTERM", flush=True)
            break
        if regroup:  # a peer is gone or a round formed: same process, a new group
            del ddp  # it holds the old group, whose connections close only once it is freed
            done = rejoin(state, print_time=args.print_time)
            rank, world = dist.get_rank(), dist.get_world_size()
            ddp = DistributedDataParallel(model)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
