"""A parameter server and two trainers over torch.distributed.rpc: a Joint-coupled job.

Where it sits: the multi-role example in the RFC's own topology (``docs/agent.md``,
Roles); run by ``torchflex-agent --role ps|trainer --role-sizes trainer=2:2,ps=1:1
--coupling Joint -- python examples/roles/ps_rpc.py`` and by
``tests/integration/agent/test_roles_example.py``. CPU only.

Joint coupling gives one group across roles: ``RANK``/``WORLD_SIZE`` global,
``ROLE_NAME``/``ROLE_RANK`` per role, so the RFC's ``rpc.init_rpc(
f"{ROLE_NAME}:{ROLE_RANK}", rank=RANK, world_size=WORLD_SIZE)`` names the
workers ``ps:0``, ``trainer:0``, ``trainer:1``. Each step a trainer pulls the
parameters from ``ps:0``, computes gradients on its own synthetic batch, pushes
them with ``rpc_async("ps:0", ...)`` (the server applies them: SGD), and the
trainers average their loss over ``role_group("trainer")``, a process group of
the trainers' ranks only. The server only serves; ``rpc.shutdown()`` (graceful)
returns on every worker once the trainers are done.

With ``--ckpt-dir`` the server owns the checkpoint (``torchflex_agent.checkpoint``:
its model and the last step every trainer finished): trainer role rank 0 tells it
each finished step (``step_done``, after the trainers' all_reduce, so both pushes of
that step are applied) and it saves every ``--ckpt-every`` steps. A Joint group
re-forms whole, so after any member's loss every process starts again: the server
loads the checkpoint and the trainers ask it where to go on from (``start_step``).

RPC is not a torchflex API (torch keeps it in maintenance mode); the roles file
and a transport of one's own are the documented alternative
(``train_with_readers.py``). Prints ``step=N loss=X world=W rank=R avg_loss=Y``
per trainer step (``W`` the joint world), ``checkpoint step=N`` and ``resumed from
step=N`` on the server, and ``ps applied N updates`` at the end (counted across
resumes: the checkpoint keeps the count).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import rpc

from torchflex_agent import roles
from torchflex_agent.checkpoint import Checkpointer


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))


class ParameterServer:
    """The ps worker's model; called by trainers over RPC (one thread per call)."""

    def __init__(self, ckpt_dir: str | None, ckpt_every: int, lr: float = 0.01) -> None:
        self.model = make_model()
        self.lr = lr
        self.updates = 0
        self.done = 0
        """The last step every trainer finished (and pushed)."""
        self.lock = threading.Lock()
        self.ckpt = Checkpointer(ckpt_dir) if ckpt_dir else None
        self.ckpt_every = ckpt_every
        state = self.ckpt.load() if self.ckpt is not None else None
        if state is not None:
            self.model.load_state_dict(state["model"])
            self.updates, self.done = int(state["updates"]), int(state["step"])
            print(f"resumed from step={self.done}", flush=True)

    def step_done(self, step: int) -> None:
        with self.lock:
            self.done = step
            if self.ckpt is None or step % self.ckpt_every:
                return
            payload = {"model": self.model.state_dict(), "updates": self.updates}
            if self.ckpt.save(step, payload):
                print(f"checkpoint step={step}", flush=True)

    def params(self) -> list[torch.Tensor]:
        with self.lock:
            return [p.detach().clone() for p in self.model.parameters()]

    def apply(self, grads: list[torch.Tensor]) -> int:
        with self.lock, torch.no_grad():
            for p, g in zip(self.model.parameters(), grads, strict=True):
                p.sub_(self.lr * g)
            self.updates += 1
            return self.updates


# Only the ps process builds it; trainers reach it through the functions below,
# which RPC runs on the ps (pickled by name: this script is __main__ everywhere).
SERVER: dict[str, ParameterServer] = {}


def get_params() -> list[torch.Tensor]:
    return SERVER["ps"].params()


def push_grads(grads: list[torch.Tensor]) -> int:
    return SERVER["ps"].apply(grads)


def step_done(step: int) -> None:
    SERVER["ps"].step_done(step)


def start_step() -> int:
    return SERVER["ps"].done


def train(steps: int, step_time: float, rank: int, world: int, trainers: dist.ProcessGroup) -> None:
    model = make_model()
    first = rpc.rpc_sync("ps:0", start_step) + 1
    for step in range(first, steps + 1):
        started = time.monotonic()
        params: list[torch.Tensor] = rpc.rpc_sync("ps:0", get_params)
        with torch.no_grad():
            for p, value in zip(model.parameters(), params, strict=True):
                p.copy_(value)
        gen = torch.Generator().manual_seed(step * 1000 + rank)
        x = torch.randn(32, 16, generator=gen)
        loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        model.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        grads = [p.grad.detach() for p in model.parameters() if p.grad is not None]
        pushed = rpc.rpc_async("ps:0", push_grads, args=(grads,))
        avg = loss.detach().clone()
        pushed.wait()
        dist.all_reduce(avg, group=trainers)  # the trainers only, not the ps
        avg /= dist.get_world_size(trainers)
        if dist.get_rank(trainers) == 0:  # every trainer's push of this step is applied
            rpc.rpc_sync("ps:0", step_done, args=(step,))
        print(f"step={step} loss={loss.item():.4f} world={world} rank={rank} "
              f"avg_loss={avg.item():.4f}", flush=True)  # fmt: skip
        time.sleep(max(0.0, step_time - (time.monotonic() - started)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=int(os.environ.get("TRAIN_STEPS", "50")))
    p.add_argument("--step-time", type=float, default=0.0, help="least seconds per step")
    p.add_argument("--ckpt-dir", type=Path, default=None, help="the server's checkpoint")
    p.add_argument("--ckpt-every", type=int, default=10)
    args = p.parse_args()
    role, role_rank = os.environ["ROLE_NAME"], int(os.environ["ROLE_RANK"])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    trainers = roles.role_group("trainer")  # collective: every rank, before any role diverges
    if role == "ps":
        ckpt = str(args.ckpt_dir) if args.ckpt_dir is not None else None
        SERVER["ps"] = ParameterServer(ckpt, args.ckpt_every)
    rpc.init_rpc(f"{role}:{role_rank}", rank=rank, world_size=world)  # type: ignore[no-untyped-call]
    if role == "trainer":
        train(args.steps, args.step_time, rank, world, trainers)
    rpc.shutdown()  # graceful: waits for every worker's outstanding calls
    if "ps" in SERVER:
        print(f"ps applied {SERVER['ps'].updates} updates", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
