"""A rendezvous member in its own process, for tests that SIGKILL or SIGTERM one.

Usage: ``python rdzv_member.py c10d|etcd PORT RUN_ID MIN MAX``. Joins, prints
its result as one JSON line, keeps heartbeating; on SIGTERM it leaves the
round explicitly (MemberLeft) and exits 0. Exits by itself after 60 s.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from types import FrameType

from torchflex_agent.rendezvous.liveness import LivenessSettings, RoundMonitor
from torchflex_agent.rendezvous.logic import NodeDescriptor, RendezvousSettings
from torchflex_agent.rendezvous.protocol import Rendezvous
from torchflex_agent.stores.kvstore import KVStore
from torchflex_contract.progress import RestartReason


def main() -> int:
    backend, port, run_id, lo, hi = sys.argv[1:6]
    store: KVStore
    if backend == "c10d":
        from torchflex_agent.stores.tcp import TCPKVStore

        store = TCPKVStore("127.0.0.1", int(port))
    else:
        from torchflex_agent.stores.etcd import EtcdKVStore

        store = EtcdKVStore([("http", "127.0.0.1", int(port))])
    node = NodeDescriptor(f"proc-{time.monotonic_ns()}", "127.0.0.1", 1, 1)
    rdzv = Rendezvous(store, run_id, node, RendezvousSettings(int(lo), int(hi), 0.3, 30.0))
    result = rdzv.next_round()
    leave = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        leave.set()

    signal.signal(signal.SIGTERM, on_term)
    monitor = RoundMonitor(rdzv, result, LivenessSettings(0.2, 1.5), threading.Event())
    monitor.start()
    print(json.dumps({"round": result.round, "rank": result.node_rank}), flush=True)
    leave.wait(60)
    if leave.is_set():
        rdzv.mark_stale(result.round, RestartReason.MEMBER_LEFT, node.node_id)
    monitor.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
