"""Trainers fed by readers: a two-role job (Independent coupling), CPU only.

Where it sits: the multi-role example (``docs/agent.md``, Roles); run by
``torchflex-agent --role trainer|reader --role-sizes trainer=2:2,reader=1:4
-- python examples/roles/train_with_readers.py`` and by
``tests/integration/agent/test_roles_example.py``. One script, two roles, the
role taken from ``ROLE_NAME``:

* ``reader``: serves synthetic batches over a plain TCP socket on
  ``TORCHFLEX_SERVICE_PORT``, forever (the job's completion role is the
  trainer; ending the readers is the operator's). Stdlib only, so a reader
  restarts fast. Request: step and trainer rank (two int64); reply: one batch.
* ``trainer``: DDP over gloo, checkpoint through ``torchflex_agent.checkpoint``
  every ``--ckpt-every`` steps (as ``examples/train_elastic.py``, which also
  shows the SIGTERM hook). Each step a rank pulls its batch from the readers
  round-robin; a reader whose connection fails is skipped and the roles file
  is read again (``torchflex_agent.roles.peers``), so readers may come, go and
  re-form while the trainers' round, processes and steps run on.

A batch depends only on (step, trainer rank), never on which reader served it,
so a reader's loss changes nothing in the training. Lines: a trainer prints
``step=N loss=X world=W rank=R reader=HOST:PORT``; a reader prints ``served
step=N to rank=R`` once per batch.
"""

from __future__ import annotations

import argparse
import array
import os
import random
import socket
import struct
import sys
import threading
import time

from torchflex_agent import roles

BATCH, FEATURES = 32, 16
REQUEST = struct.Struct("!qq")  # step, trainer rank
REPLY_BYTES = BATCH * FEATURES * 4  # float32


def make_batch(step: int, rank: int) -> bytes:
    """The batch of (step, rank): the same bytes whichever reader makes it."""
    rng = random.Random(step * 1000 + rank)
    return array.array("f", (rng.gauss(0.0, 1.0) for _ in range(BATCH * FEATURES))).tobytes()


def recv_exactly(conn: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError(f"peer closed after {len(data)} of {size} bytes")
        data += chunk
    return bytes(data)


def handle(conn: socket.socket) -> None:
    """One trainer's connection: a batch per request, until the trainer goes."""
    with conn:
        while True:
            try:
                step, rank = REQUEST.unpack(recv_exactly(conn, REQUEST.size))
                conn.sendall(make_batch(step, rank))
            except OSError:  # the trainer closed, finished or died
                return
            print(f"served step={step} to rank={rank}", flush=True)


def serve() -> int:
    """Reader: one thread per trainer connection, until the process is ended."""
    port = roles.service_port()
    # create_server sets SO_REUSEADDR: a re-formed reader binds its kept port at once.
    with socket.create_server(("", port)) as server:
        print(f"reader serving on port {port}", flush=True)
        while True:
            conn, _ = server.accept()
            threading.Thread(target=handle, args=(conn,), daemon=True).start()


class ReaderClient:
    """Round-robin over the reader role's workers, skipping those that fail."""

    REFRESH_S = 1.0  # readers that joined are picked up within this, failures or not

    def __init__(self, patience: float) -> None:
        self.patience = patience  # how long a batch may wait for any reader
        self.peers: list[roles.Peer] = []
        self.read_at = -self.REFRESH_S
        self.next = 0
        self.conns: dict[tuple[str, int], socket.socket] = {}

    def refresh(self) -> None:
        """Learn who serves now: the roles file the agent keeps current."""
        self.peers = roles.peers("reader")
        self.read_at = time.monotonic()

    def fetch(self, step: int, rank: int) -> tuple[bytes, str]:
        """The batch of (step, rank) and the reader (``host:port``) that served it."""
        deadline = time.monotonic() + self.patience
        while time.monotonic() < deadline:
            if time.monotonic() - self.read_at >= self.REFRESH_S:
                self.refresh()
            start = self.next % max(len(self.peers), 1)
            for peer in self.peers[start:] + self.peers[:start]:
                self.next += 1
                addr = (peer.host, peer.port)
                try:
                    return self.ask(addr, step, rank), f"{peer.host}:{peer.port}"
                except OSError:
                    # Gone, or its role is re-forming: skip it; re-read the file next time.
                    self.drop(addr)
                    self.read_at = -self.REFRESH_S
            # Every listed reader failed (or none is listed yet): learn who serves now.
            self.refresh()
            time.sleep(0.2)
        raise TimeoutError(f"no reader served step {step} within {self.patience:.0f}s")

    def ask(self, addr: tuple[str, int], step: int, rank: int) -> bytes:
        if addr not in self.conns:
            self.conns[addr] = socket.create_connection(addr, timeout=5.0)
        conn = self.conns[addr]
        conn.sendall(REQUEST.pack(step, rank))
        return recv_exactly(conn, REPLY_BYTES)

    def drop(self, addr: tuple[str, int]) -> None:
        conn = self.conns.pop(addr, None)
        if conn is not None:
            conn.close()


def train(args: argparse.Namespace) -> int:
    """Trainer: DDP over gloo on batches pulled from the readers."""
    # torch only here: readers never import it, so they start (and re-form) fast.
    import datetime

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from torchflex_agent.checkpoint import Checkpointer
    from torchflex_agent.progress import report_step

    # A peer rank may wait up to --patience for a batch while readers re-form.
    timeout = datetime.timedelta(seconds=args.patience + 60)
    dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ckpt = Checkpointer(args.ckpt_dir) if args.ckpt_dir else None
    state = ckpt.load() if ckpt is not None else None
    done = 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        done = int(state["step"])
    restarts = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    where = f"round={os.environ.get('TORCHFLEX_ROUND', '0')} restarts={restarts}"
    print(f"trainer start step={done} {where} pid={os.getpid()}", flush=True)
    ddp = DistributedDataParallel(model)
    client = ReaderClient(args.patience)
    while done < args.steps:
        started = time.monotonic()
        raw, served_by = client.fetch(done + 1, rank)
        x = torch.frombuffer(bytearray(raw), dtype=torch.float32).view(BATCH, FEATURES)
        loss = nn.functional.mse_loss(ddp(x), x.sum(dim=1, keepdim=True))
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]  # DDP all-reduces here
        opt.step()
        done += 1
        time.sleep(max(0.0, args.step_time - (time.monotonic() - started)))
        print(f"step={done} loss={loss.item():.4f} world={world} rank={rank} "
              f"reader={served_by}", flush=True)  # fmt: skip
        report_step(done)
        if ckpt is not None and rank == 0 and (done % args.ckpt_every == 0 or done == args.steps):
            ckpt.save(done, {"model": model.state_dict(), "opt": opt.state_dict()})
    dist.destroy_process_group()
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=int(os.environ.get("TRAIN_STEPS", "100")))
    p.add_argument("--step-time", type=float, default=0.1)
    p.add_argument("--ckpt-dir", default=os.environ.get("CKPT_DIR", ""))
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--patience", type=float, default=60.0, help="seconds a batch may wait")
    args = p.parse_args()
    role = os.environ.get("ROLE_NAME", "")
    if role == "reader":
        return serve()
    if role == "trainer":
        return train(args)
    print(f"ROLE_NAME must be trainer or reader, got {role!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
