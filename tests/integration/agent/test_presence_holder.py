"""The presence server's holder process with real processes and sockets (loopback only).

``liveness.PresenceServer`` hands its listening socket to a small stdlib-only
child that holds every presence link, so a dying pod's links close as soon as
that child is gone, not after the agent's large address space is torn down.
Shown here: a link stays held while the agent lives (a SIGTERM to the holder,
as a process-group signal would send, changes nothing), and it closes when
the agent closes the server, when the agent process alone is SIGKILLed (the
holder follows it), and when the holder itself is killed. Every process is
started here and stopped by PID.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from tests.integration.agent.tfagent_helpers import pid_alive
from torchflex_agent.rendezvous.liveness import PresenceServer

# An agent stand-in: a process that starts a PresenceServer and prints its port and holder.
AGENT = textwrap.dedent(
    """
    import time
    from torchflex_agent.rendezvous.liveness import PresenceServer
    server = PresenceServer()
    print(server.port, server.pid, flush=True)
    time.sleep(120)
    """
)
_EOF_WAIT_S = 10.0


def link(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=_EOF_WAIT_S)


def held(conn: socket.socket) -> bool:
    """Whether the link is still open: nothing to read yet (the holder never sends)."""
    conn.setblocking(False)
    try:
        return conn.recv(1) != b""
    except BlockingIOError:
        return True
    finally:
        conn.settimeout(_EOF_WAIT_S)


def closed(conn: socket.socket) -> bool:
    """Whether the other end closed the link (EOF read within the bounded wait)."""
    try:
        return conn.recv(1) == b""
    except ConnectionResetError:
        return True


@pytest.fixture()
def agent() -> Iterator[tuple[subprocess.Popen[str], int, int]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", AGENT], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    holder = 0
    try:
        assert proc.stdout is not None
        port, holder = (int(x) for x in proc.stdout.readline().split())
        yield proc, port, holder
    finally:
        for pid in (proc.pid, holder):
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        proc.wait(10)


@pytest.mark.timeout(60)
def test_close_ends_links_and_holder() -> None:
    server = PresenceServer()
    with link(server.port) as conn, link(server.port) as other:
        assert held(conn) and held(other)
        other.close()  # a watcher whose round ended drops its link; the rest stay
        assert held(conn)
        os.kill(server.pid, signal.SIGTERM)  # the agent handles SIGTERM, not the holder
        assert held(conn)
        server.close()
        assert closed(conn)
    assert not pid_alive(server.pid, _EOF_WAIT_S)


@pytest.mark.timeout(60)
def test_agent_sigkilled_alone_the_holder_follows(
    agent: tuple[subprocess.Popen[str], int, int],
) -> None:
    proc, port, holder = agent
    with link(port) as conn:
        assert held(conn)
        os.kill(proc.pid, signal.SIGKILL)  # the agent only: the holder reads EOF on stdin
        assert closed(conn)
    assert not pid_alive(holder, _EOF_WAIT_S)


@pytest.mark.timeout(60)
def test_holder_killed_closes_links_while_the_agent_lives(
    agent: tuple[subprocess.Popen[str], int, int],
) -> None:
    proc, port, holder = agent
    with link(port) as conn:
        os.kill(holder, signal.SIGKILL)  # a pod's death kills every process, this one too
        assert closed(conn)
    assert proc.poll() is None
