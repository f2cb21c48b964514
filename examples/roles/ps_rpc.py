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

RPC is not a torchflex API (torch keeps it in maintenance mode); the roles file
and a transport of one's own are the documented alternative
(``train_with_readers.py``). Prints ``step=N loss=X avg_loss=Y rank=R`` per
trainer step and ``ps applied N updates`` at the end.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import threading

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import rpc

from torchflex_agent import roles


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))


class ParameterServer:
    """The ps worker's model; called by trainers over RPC (one thread per call)."""

    def __init__(self, lr: float = 0.01) -> None:
        self.model = make_model()
        self.lr = lr
        self.updates = 0
        self.lock = threading.Lock()

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


def train(steps: int, rank: int, trainers: dist.ProcessGroup) -> None:
    model = make_model()
    for step in range(1, steps + 1):
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
        dist.all_reduce(avg, group=trainers)  # the trainers only, not the ps
        avg /= dist.get_world_size(trainers)
        pushed.wait()
        print(f"step={step} loss={loss.item():.4f} avg_loss={avg.item():.4f} rank={rank}",
              flush=True)  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=int(os.environ.get("TRAIN_STEPS", "50")))
    args = p.parse_args()
    role, role_rank = os.environ["ROLE_NAME"], int(os.environ["ROLE_RANK"])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    trainers = roles.role_group("trainer")  # collective: every rank, before any role diverges
    if role == "ps":
        SERVER["ps"] = ParameterServer()
    rpc.init_rpc(f"{role}:{role_rank}", rank=rank, world_size=world)  # type: ignore[no-untyped-call]
    if role == "trainer":
        train(args.steps, rank, trainers)
    rpc.shutdown()  # graceful: waits for every worker's outstanding calls
    if "ps" in SERVER:
        print(f"ps applied {SERVER['ps'].updates} updates", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
