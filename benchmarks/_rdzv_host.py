"""A process hosting rendezvous members for ``benchmarks.rendezvous``, one thread each.

Where it sits: the driver starts a few of these (``python -m
benchmarks._rdzv_host``) and keeps them for the whole run, so no trial pays a
Python + torch start. It talks JSON lines on stdin/stdout:

- ``{"op": "prepare", "system", "run_id", "n", "count", "port", "op_timeout",
  "roles", "first"}``: build ``count`` members of a rendezvous of ``n`` (each
  with its own store connection, like separate agents; ``op_timeout``, if not
  null, is a ``TCPKVStore``'s per-call deadline in place of the agent's), park
  their threads, answer ``{"ready": true}``. With ``roles`` > 1 (torchflex
  only) the trial's members, numbered from ``first`` on this host, alternate
  over that many Independent roles of ``n / roles`` each, each role under its
  own key id (``_rdzv_stats.role_key_id``), as a multi-role job's agents;
- ``{"op": "go", "at": T, "timeout": S}``: at monotonic time ``T`` release
  every parked member at once; answer ``{"members": [...]}`` (see
  ``_rdzv_stats.MemberResult``) once all returned or ``S`` seconds passed;
- ``{"op": "exit"}`` (or EOF): leave.

Systems: ``torchflex-c10d`` and ``torchflex-etcd`` run the agent's own
``Rendezvous.next_round`` over ``TCPKVStore`` / ``EtcdKVStore``;
``torch-c10d`` runs torch's ``DynamicRendezvousHandler.next_rendezvous`` over
``C10dRendezvousBackend`` on a TCPStore client. All talk to 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from benchmarks._rdzv_stats import MemberResult, role_key_id, role_of

SYSTEMS = ("torchflex-c10d", "torchflex-etcd", "torch-c10d")

# Torch's shared-store bootstrap (rank 0 starting a second TCPStore) is off,
# as the project's own notes recommend for torchrun; torchflex never starts one.
os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")


class Member:
    """One rendezvous participant: ``join`` returns (rank, world size); ``close`` cleans up."""

    def __init__(
        self, join: Callable[[], tuple[int, int]], close: Callable[[], None], role: int = 0
    ) -> None:
        self.join = join
        self.close = close
        self.role = role
        self.result: MemberResult | None = None

    def run(self, go: threading.Event) -> None:
        go.wait()
        start = time.monotonic()
        try:
            rank, world = self.join()
        except Exception as exc:
            error = repr(exc)[:300]
            self.result = MemberResult(start, time.monotonic(), None, None, error, self.role)
            return
        self.result = MemberResult(start, time.monotonic(), rank, world, role=self.role)


def _torchflex_member(
    system: str, run_id: str, n: int, port: int, timeout: float, *, op_timeout: float | None
) -> Member:
    from torchflex_agent.rendezvous.logic import NodeDescriptor, RendezvousSettings
    from torchflex_agent.rendezvous.protocol import Rendezvous
    from torchflex_agent.stores.kvstore import KVStore

    store: KVStore
    if system == "torchflex-c10d":
        from torchflex_agent.stores.tcp import TCPKVStore

        store = (
            TCPKVStore("127.0.0.1", port)
            if op_timeout is None
            else TCPKVStore("127.0.0.1", port, op_timeout=op_timeout)
        )
    else:
        from torchflex_agent.stores.etcd import EtcdKVStore

        store = EtcdKVStore([("http", "127.0.0.1", port)])
    node = NodeDescriptor(f"m-{os.getpid()}-{time.monotonic_ns()}", "127.0.0.1", 29500, 1)
    # min = max = n: the n-th arrival closes the round; last call never applies.
    rdzv = Rendezvous(store, run_id, node, RendezvousSettings(n, n, 30.0, timeout))

    def join() -> tuple[int, int]:
        result = rdzv.next_round()
        return result.node_rank, result.world_size

    return Member(join, store.close)


def _torch_member(run_id: str, n: int, port: int, timeout: float) -> Member:
    from torch._C._distributed_c10d import TCPStore
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
        C10dRendezvousBackend,
    )
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        DynamicRendezvousHandler,
        RendezvousTimeout,
    )

    store = TCPStore(
        "127.0.0.1",
        port,
        is_master=False,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=timeout),
    )
    backend = C10dRendezvousBackend(store, run_id)
    handler = DynamicRendezvousHandler.from_backend(
        run_id,
        store,
        backend,
        min_nodes=n,
        max_nodes=n,
        local_addr="127.0.0.1",
        timeout=RendezvousTimeout(join=datetime.timedelta(seconds=timeout)),
    )

    def join() -> tuple[int, int]:
        info = handler.next_rendezvous()
        return info.rank, info.world_size

    def close() -> None:
        # Stops its keep-alive timer; the run id is never reused.
        with contextlib.suppress(Exception):
            handler.shutdown()

    return Member(join, close)


def build(
    system: str,
    run_id: str,
    n: int,
    port: int,
    timeout: float,
    *,
    op_timeout: float | None = None,
    roles: int = 1,
    index: int = 0,
) -> Member:
    """Member ``index`` of the trial (its role: ``role_of(index, roles)``)."""
    if system == "torch-c10d":
        if roles != 1:
            raise ValueError("torch-c10d has no Independent roles")
        return _torch_member(run_id, n, port, timeout)
    if system in ("torchflex-c10d", "torchflex-etcd"):
        role = role_of(index, roles)
        key_id = role_key_id(run_id, role, roles)
        member = _torchflex_member(system, key_id, n // roles, port, timeout, op_timeout=op_timeout)
        member.role = role
        return member
    raise ValueError(f"unknown system {system!r}")


def _reply(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def serve() -> int:
    # Imported before the first trial, so no trial pays for it.
    import torch.distributed  # noqa: F401

    members: list[Member] = []
    threads: list[threading.Thread] = []
    go = threading.Event()
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.get("op")
        if op == "exit":
            break
        if op == "prepare":
            go = threading.Event()
            members = [
                build(
                    cmd["system"],
                    cmd["run_id"],
                    cmd["n"],
                    cmd["port"],
                    cmd["timeout"],
                    op_timeout=cmd.get("op_timeout"),
                    roles=int(cmd.get("roles", 1)),
                    index=int(cmd.get("first", 0)) + i,
                )
                for i in range(cmd["count"])
            ]
            threads = [threading.Thread(target=m.run, args=(go,), daemon=True) for m in members]
            for t in threads:
                t.start()
            _reply({"ready": True})
        elif op == "go":
            time.sleep(max(0.0, float(cmd["at"]) - time.monotonic()))
            go.set()
            deadline = time.monotonic() + float(cmd["timeout"])
            for t in threads:
                t.join(max(0.0, deadline - time.monotonic()))
            now = time.monotonic()
            results = [
                m.result
                if m.result is not None
                else MemberResult(now, now, None, None, "did not return before the trial timeout")
                for m in members
            ]
            _reply({"members": [r.to_json() for r in results]})
        elif op == "close":
            # Separate from "go": torch's handler.shutdown() closes the run id
            # for everyone, so no host may do it before every host finished.
            for m in members:
                with contextlib.suppress(Exception):
                    m.close()
            members, threads = [], []
            _reply({"closed": True})
        else:
            _reply({"error": f"unknown op {op!r}"})
    return 0


if __name__ == "__main__":
    sys.exit(serve())
