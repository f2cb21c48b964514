"""Local processes the harness, the tests and the benchmarks start themselves.

Where it sits: one copy, below everything that starts a local server or
helper process: the control plane (``cluster.controlplane``,
``cluster.enforcer``), the agent and operator integration tests, and the
benchmarks. It imports only the standard library, so a test of the agent
can use it without loading the cluster package. The agent keeps its own
``free_port`` (product code never imports the harness).

Stopping is by the ``Popen`` we hold (its PID), never by a name pattern.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess


def free_port() -> int:
    """A loopback TCP port free right now; the caller's process binds it shortly after."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_process(proc: subprocess.Popen[bytes] | subprocess.Popen[str], grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds; only the process we started, by PID."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(10)
