"""``torchflex-agent store``: the per-job c10d TCPStore server.

Where it sits: the operator runs this in the job's store pod; every agent
(``--rdzv-backend c10d``) connects to it as a client. Hosting the store
outside the agents means no single training node's death takes the
rendezvous state with it. It serves until SIGTERM or SIGINT. Its state is in
memory only: if the pod restarts, agents see their connections drop,
reconnect and re-form from an empty store (restart reason StoreLost).
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import signal
import sys
from collections.abc import Mapping
from types import FrameType

from torchflex_contract import env as tfenv
from torchflex_contract.exit_codes import ExitCode

log = logging.getLogger(__name__)

RESOLVER_OPTIONS = "timeout:1 attempts:1"
"""glibc's ``RES_OPTIONS`` for the store process (read when its resolver first runs).

torch's TCPStore server looks up each accepted peer's name (reverse DNS, for its
log) on its one event-loop thread, so a lost answer stalls every client: with
glibc's default (5 s, 2 tries) the store froze 5 s at a time while 1,024
agents connected, past any in-flight call's 2 s deadline. One 1 s try bounds
that where the store runs outside the operator's pod (whose resolver,
loopback, fails at once: ``stores.registry.STORE_DNS``)."""


def resolver_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables to set before the store starts: ``RES_OPTIONS`` unless the caller set it."""
    return {} if "RES_OPTIONS" in environ else {"RES_OPTIONS": RESOLVER_OPTIONS}


def serve(host: str, port: int) -> int:
    # Before the TCPStore exists: its loop thread initialises the resolver.
    os.environ.update(resolver_env(os.environ))
    from torch._C._distributed_c10d import TCPStore

    stopping = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    store = TCPStore(
        host,
        port,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=30),
        use_libuv=True,
    )
    # The bound port is printed so a caller that asked for port 0 can find it.
    print(f"torchflex-agent store: listening on {host}:{store.port}", flush=True)
    while not stopping:
        signal.pause()
    log.info("store: signal received, shutting down")
    # Exit at once: destroying the libuv server waits on its clients, which
    # kept a deleted store pod alive (and its agents connected to a store
    # that no longer exists in the API) until the kubelet's SIGKILL. The
    # state is in memory by design; clients see their connections drop.
    logging.shutdown()
    sys.stdout.flush()
    os._exit(0)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="torchflex-agent store", description=__doc__)
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=tfenv.DEFAULT_STORE_PORT)
    try:
        ns = p.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    if not 0 <= ns.port < 65536:
        print(f"torchflex-agent store: --port out of range: {ns.port}", file=sys.stderr)
        return ExitCode.USAGE
    return serve(ns.host, ns.port)
