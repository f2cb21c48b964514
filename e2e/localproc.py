"""Local processes the harness, the tests and the benchmarks start themselves.

Where it sits: one copy, below everything that starts a local server or
helper process: the control plane (``cluster.controlplane``,
``cluster.kueue``), the agent and operator integration tests, and the
benchmarks. It imports only the standard library, so a test of the agent
can use it without loading the cluster package. The agent keeps its own
``free_port`` (product code never imports the harness).

Stopping is by the ``Popen`` we hold (its PID), never by a name pattern.
The pinned binaries they start (etcd) are found with :func:`pinned_binary`.
:class:`LineLog` reads what such a process prints, line by line with the
time each line arrived (the agent tests wait on lines; the process-level
benchmarks compare the lines' times with the moment they killed a node).
"""

from __future__ import annotations

import contextlib
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

_TOOLCHAIN = Path(__file__).resolve().parent / "toolchain" / "build.sh"


def pinned_binary(name: str) -> str:
    """A binary of the pinned toolchain, by path (``build.sh --print``; builds nothing)."""
    out = subprocess.run(
        ["bash", str(_TOOLCHAIN), "--print"], capture_output=True, text=True, check=True, timeout=60
    )
    return str(Path(out.stdout.strip()) / name)


def free_port() -> int:
    """A loopback TCP port free right now; the caller's process binds it shortly after."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(ip: str, port: int, timeout: float = 1.0) -> bool:
    """Whether something accepts TCP connections on ``ip:port`` (a loopback address)."""
    try:
        with socket.create_connection((ip, port), timeout=timeout):
            return True
    except OSError:  # refused: nobody listens; timeout: nothing we could reach
        return False


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


class LineLog:
    """A process's output lines with their arrival times, collected by a thread.

    ``proc`` runs with ``stdout=PIPE`` in text mode. Times come from ``clock``:
    monotonic by default (for waits and intervals); ``time.time`` where lines
    are compared with wall-clock stamps the workers print themselves.
    """

    def __init__(
        self, proc: subprocess.Popen[str], name: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.proc = proc
        self.name = name
        self.lines: list[tuple[float, str]] = []
        self._clock = clock
        self._cond = threading.Condition()
        assert proc.stdout is not None
        self._thread = threading.Thread(target=self._pump, args=(proc.stdout,), daemon=True)
        self._thread.start()

    def _pump(self, stream: Iterable[str]) -> None:
        for line in stream:
            with self._cond:
                self.lines.append((self._clock(), line.rstrip("\n")))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_for(
        self, pred: Callable[[str], bool], timeout: float, after: float = 0.0
    ) -> tuple[float, str]:
        """First line at or after ``after`` matching ``pred``; AssertionError on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for t, line in self.lines:
                    if t >= after and pred(line):
                        return t, line
                left = deadline - time.monotonic()
                if left <= 0:
                    tail = "\n".join(f"  {line}" for _, line in self.lines[-40:])
                    raise AssertionError(
                        f"{self.name}: no matching line in {timeout}s; tail:\n{tail}"
                    )
                self._cond.wait(left)

    def timed(self) -> list[tuple[float, str]]:
        """A copy of every (time, line) so far."""
        with self._cond:
            return list(self.lines)

    def texts(self) -> list[str]:
        """Every line so far, without times."""
        with self._cond:
            return [line for _, line in self.lines]

    def text(self) -> str:
        return "\n".join(self.texts())

    def matching(self, pattern: str) -> list[tuple[float, re.Match[str]]]:
        rx = re.compile(pattern)
        with self._cond:
            out = []
            for t, line in self.lines:
                m = rx.search(line)
                if m:
                    out.append((t, m))
            return out
