"""Process helpers for the agent's integration tests: store server, etcd, agents.

Where it sits: imported by the test modules in this folder (pytest puts the
folder on ``sys.path``). Every process started here is started by the test,
tracked by PID, and stopped by PID in the fixture's teardown; every wait is
bounded. Network: 127.0.0.1 only.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from e2e.localproc import free_port, stop_process

REPO = Path(__file__).resolve().parents[3]
VENV_BIN = Path(sys.executable).parent
AGENT_BIN = str(VENV_BIN / "torchflex-agent")
PYTHON = sys.executable
EXAMPLE = str(REPO / "examples" / "train_elastic.py")
ETCD_BUILD = REPO / "e2e" / "toolchain" / "build.sh"


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    for key in list(env):
        if key.startswith("TORCHFLEX_"):
            del env[key]
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONWARNINGS"] = "ignore"
    env.update(extra or {})
    return env


class LineLog:
    """Collects a process's output lines with arrival times (monotonic) in a thread."""

    def __init__(self, proc: subprocess.Popen[str], name: str) -> None:
        self.proc = proc
        self.name = name
        self.lines: list[tuple[float, str]] = []
        self._cond = threading.Condition()
        assert proc.stdout is not None
        self._thread = threading.Thread(target=self._pump, args=(proc.stdout,), daemon=True)
        self._thread.start()

    def _pump(self, stream: Iterator[str]) -> None:
        for line in stream:
            with self._cond:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
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

    def text(self) -> str:
        with self._cond:
            return "\n".join(line for _, line in self.lines)

    def matching(self, pattern: str) -> list[tuple[float, re.Match[str]]]:
        rx = re.compile(pattern)
        with self._cond:
            out = []
            for t, line in self.lines:
                m = rx.search(line)
                if m:
                    out.append((t, m))
            return out


def start_store(port: int = 0, timeout: float = 60.0) -> tuple[subprocess.Popen[str], int, LineLog]:
    proc = subprocess.Popen(
        [AGENT_BIN, "store", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=child_env(),
    )
    log = LineLog(proc, "store")
    try:
        _, line = log.wait_for(lambda s: "listening on" in s, timeout)
    except AssertionError:
        stop_process(proc)
        raise
    return proc, int(line.rsplit(":", 1)[1]), log


def etcd_binary() -> str:
    out = subprocess.run(
        ["bash", str(ETCD_BUILD), "--print"], capture_output=True, text=True, check=True, timeout=60
    )
    return str(Path(out.stdout.strip()) / "etcd")


def start_etcd(
    data_dir: Path, timeout: float = 30.0, client: int = 0, peer: int = 0
) -> tuple[subprocess.Popen[bytes], int]:
    """A real etcd on 127.0.0.1 (given ports, e.g. to restart it in place, or free ones)."""
    client, peer = client or free_port(), peer or free_port()
    proc = subprocess.Popen(
        [
            etcd_binary(),
            "--name", "t",
            "--data-dir", str(data_dir),
            "--listen-client-urls", f"http://127.0.0.1:{client}",
            "--advertise-client-urls", f"http://127.0.0.1:{client}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"t=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync",
            "--log-level", "error",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    from torchflex_agent.errors import StoreUnavailableError
    from torchflex_agent.store_etcd import connect_etcd_with_retry

    try:
        store = connect_etcd_with_retry(
            [("http", "127.0.0.1", client)], None, time.monotonic() + timeout
        )
        store.close()
    except StoreUnavailableError:
        stop_process(proc)
        raise
    return proc, client
