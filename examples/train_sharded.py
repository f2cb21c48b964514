"""A sharded (ZeRO-style) example adopting the state API: a lost member's shard from its peer.

Where it sits: the sharded sibling of ``examples/train_stateful.py``; run by
``torchflex-agent --nnodes N:N ... -- python examples/train_sharded.py`` and
by ``tests/integration/agent/test_state_peer.py`` (through a SIGKILL and a
freeze in place, and a SIGKILL with ``--no-in-place``, the restart path:
new workers restore from the agents' copies). Each rank owns one shard
of the model's flat parameter vector and of its momentum (ZeRO stage 3's
storage in miniature): a step all-gathers the shards into the parameters,
runs forward and backward on its own batch, all-reduces the gradient and
updates only its own shard. No rank holds another's shard, so the state is
registered with ``TrainState(..., sharded=True)``: after each ``commit`` the
shard also goes to the rank's ring successor, and after a member's loss its
replacement gets the lost shard from that peer copy, without disk.

Each shard also carries ``mark = shard * 1e6 + step`` (a value a test can
check) and a checksum of its tensors, printed on every line:
``step=N loss=X world=W rank=R shard=S mark=M sum=C`` (printed right after
the step's commit, before its pacing: every rank committed a printed step,
which is lost only when a member died after its own commit and before the
copy reached its peer; the group then resumes one step back) and on every resume
``restored step=N from=local|rank K slot=<slot> shard=S mark=M sum=C
round=R`` (`` in place`` when the same process re-formed). The shards'
layout depends on the world size: run it at a fixed size (``--nnodes N:N``).
When no whole copy exists (first start, or a size change) it starts fresh;
a real script would load its sharded disk checkpoint there (e.g.
``torch.distributed.checkpoint``, which reshards).
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
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from torchflex_agent.progress import report_step
from torchflex_agent.state import Restored, TrainState

PG_TIMEOUT = datetime.timedelta(seconds=60)
LR, MOMENTUM = 0.01, 0.9


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=int(os.environ.get("TRAIN_STEPS", "100")))
    p.add_argument("--step-time", type=float, default=float(os.environ.get("STEP_TIME", "0.1")))
    p.add_argument(
        "--in-place",
        action=argparse.BooleanOptionalAction,
        default=os.environ.get("TRAIN_IN_PLACE", "1") == "1",
        help="re-create the process group in place when the agent keeps this worker",
    )
    return p.parse_args()


class Shard:
    """This rank's shard: its slice of the flat parameters and momentum, and its mark."""

    def __init__(self, full: torch.Tensor, rank: int, world: int) -> None:
        self.reset(full, rank, world)

    def reset(self, full: torch.Tensor, rank: int, world: int) -> None:
        """Rank ``rank``'s shard of the flat parameters ``full`` in a group of ``world``."""
        self.numel = full.numel()
        self.size = -(-self.numel // world)
        padded = torch.zeros(self.size * world)
        padded[: self.numel] = full
        self.index = rank
        self.params = padded[rank * self.size : (rank + 1) * self.size].clone()
        self.momentum = torch.zeros(self.size)
        self.mark = float(rank * 1_000_000)

    def state_dict(self) -> dict[str, Any]:
        return {"params": self.params, "momentum": self.momentum, "mark": self.mark}

    def load_state_dict(self, sd: dict[str, Any], /) -> None:
        self.params, self.momentum = sd["params"].clone(), sd["momentum"].clone()
        self.mark = float(sd["mark"])

    def describe(self) -> str:
        total = float(self.params.sum()) + float(self.momentum.sum())
        return f"shard={self.index} mark={self.mark:.0f} sum={total:.9g}"


def train_step(
    model: nn.Module, shard: Shard, state: TrainState, step: int, *, world: int, stop: bool
) -> tuple[float, bool, bool]:
    """One ZeRO-style step, kept once complete: (loss, stop, re-form)."""
    params = list(model.parameters())
    gathered = [torch.empty(shard.size) for _ in range(world)]
    dist.all_gather(gathered, shard.params)
    vector_to_parameters(torch.cat(gathered)[: shard.numel], params)
    gen = torch.Generator().manual_seed((step - 1) * 1000 + shard.index)
    x = torch.randn(32, 16, generator=gen)
    loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
    model.zero_grad()
    loss.backward()  # type: ignore[no-untyped-call]
    grad = torch.zeros(shard.size * world)
    grad[: shard.numel] = parameters_to_vector([p.grad for p in params if p.grad is not None])
    dist.all_reduce(grad)
    mine = grad[shard.index * shard.size : (shard.index + 1) * shard.size] / world
    shard.momentum.mul_(MOMENTUM).add_(mine)
    shard.params.sub_(LR * shard.momentum)
    shard.mark = float(shard.index * 1_000_000 + step)
    state.commit(step)  # this rank's shard: in its agent's memory and on its ring successor
    flag = torch.tensor([float(stop), float(state.reform_due())])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return loss.item(), flag[0].item() > 0, flag[1].item() > 0


def announce(got: Restored | None, shard: Shard, how: str = "") -> int:
    if got is None:
        print("no whole copy of every shard: fresh start", flush=True)
        return 0
    where = f"rank {got.source}" if got.broadcast else "local"
    print(
        f"restored step={got.step} from={where} slot={got.slot} {shard.describe()} "
        f"round={got.meta.round}{how}",
        flush=True,
    )
    return got.step


def initial_parameters() -> tuple[nn.Module, torch.Tensor]:
    """The model and its flat initial parameters (the same on every rank)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    return model, parameters_to_vector(model.parameters()).detach()


@record
def main() -> int:
    args = parse_args()
    stop_requested = threading.Event()

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        stop_requested.set()

    signal.signal(signal.SIGTERM, on_sigterm)
    dist.init_process_group("gloo", timeout=PG_TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    model, full = initial_parameters()
    shard = Shard(full, rank, world)
    state = TrainState(shard=shard, sharded=True, in_place=args.in_place)
    done = announce(state.restore(), shard)
    while done < args.steps:
        started = time.monotonic()
        try:
            loss, stopping, regroup = train_step(
                model, shard, state, done + 1, world=world, stop=stop_requested.is_set()
            )
        except RuntimeError:  # gloo's "Connection closed by peer": a member is gone
            if not state.kept():
                raise  # the restart path: the agent starts new workers
            loss, stopping, regroup = None, False, True
        if state.in_place and stopping and not stop_requested.is_set():
            stopping, regroup = False, True  # a peer leaves: re-form without it
        if regroup and loss is not None and not state.kept():
            stopping, regroup = True, False
        if loss is not None:
            done += 1
            # Printed before the pacing (a stand-in for the next step's compute), so
            # that a member lost during it has printed the step its copies hold.
            line = f"step={done} loss={loss:.4f} world={world} rank={rank} {shard.describe()}"
            print(line, flush=True)
            report_step(done)
            left = args.step_time - (time.monotonic() - started)
            if left > 0:
                stop_requested.wait(left)
        if stopping:
            print(f"stopping at step={done} on SIGTERM", flush=True)
            break
        if regroup:  # same process, a new group; the shard comes from whoever holds it
            got = state.reform(wait=60.0, timeout=PG_TIMEOUT)
            rank, world = dist.get_rank(), dist.get_world_size()
            if got is None:  # another size: this toy starts over (a real script: disk)
                shard.reset(full, rank, world)
            shard.index = rank  # rank r of the new round holds shard r
            done = announce(got, shard, " in place")
    state.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
