"""Is anyone still listening on these presence ports? One parallel connect per member.

Where it sits: a joiner that finds a full round running without it
(``rendezvous.protocol.Rendezvous._wait_out_round``) asks whether the round's members
are still there before it settles down to wait. Every agent keeps its
``rendezvous.liveness.PresenceServer`` listening for its whole life, so a connection
*refused* on a member's published presence port means that agent's process
is gone (its pod IP answered, nothing listens). Anything else proves
nothing and is left to the heartbeat check: a timeout (the address is gone
or a network policy drops the packets), an unreachable host, a successful
connect (the agent lives; we close at once, its server just sees EOF).
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import selectors
import socket
import time
from collections.abc import Sequence

PROBE_TIMEOUT_S = 0.5
"""The whole probe's bound: refusals come back within a round trip."""


def refused(targets: Sequence[tuple[str, int]], timeout: float = PROBE_TIMEOUT_S) -> list[int]:
    """Indices of ``(addr, port)`` targets whose connection was refused within ``timeout``.

    Targets with port 0 (no presence server published) or an address that is
    not a literal IP (no DNS lookups on this path) are never counted refused.
    """
    sel = selectors.DefaultSelector()
    out: list[int] = []
    socks: list[socket.socket] = []
    try:
        for i, (addr, port) in enumerate(targets):
            try:
                family = (
                    socket.AF_INET6 if ipaddress.ip_address(addr).version == 6 else socket.AF_INET
                )
            except ValueError:
                continue
            if port <= 0:
                continue
            sock = socket.socket(family, socket.SOCK_STREAM)
            socks.append(sock)
            sock.setblocking(False)
            code = sock.connect_ex((addr, port))
            if code == errno.ECONNREFUSED:
                out.append(i)
            elif code in (errno.EINPROGRESS, errno.EAGAIN):
                sel.register(sock, selectors.EVENT_WRITE, i)
        deadline = time.monotonic() + timeout
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for key, _ in sel.select(left):
                ready = key.fileobj
                assert isinstance(ready, socket.socket)
                if ready.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == errno.ECONNREFUSED:
                    out.append(int(key.data))
                sel.unregister(ready)
    finally:
        sel.close()
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.close()
    return sorted(out)
