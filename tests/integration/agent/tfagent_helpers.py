"""Process helpers for the agent's integration tests: store server, etcd, agents.

Where it sits: imported by the test modules in this folder (pytest puts the
folder on ``sys.path``); a process's output lines are read with
``e2e.localproc.LineLog``, as the benchmarks read theirs. Every process started
here is started by the test, tracked by PID, and stopped by PID in the
fixture's teardown; every wait is bounded. Network: 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from e2e.localproc import LineLog, free_port, pinned_binary, stop_process
from e2e.polling import poll_until
from torchflex_agent.checkpoint import CheckpointMeta
from torchflex_contract.progress import STATUS_PATH, AgentReport

REPO = Path(__file__).resolve().parents[3]
VENV_BIN = Path(sys.executable).parent
AGENT_BIN = str(VENV_BIN / "torchflex-agent")
PYTHON = sys.executable
EXAMPLE = str(REPO / "examples" / "train_elastic.py")
STEP = re.compile(r"^\[rank (\d+)\] step=(\d+) .*world=(\d+)")


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    for key in list(env):
        if key.startswith("TORCHFLEX_"):
            del env[key]
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONWARNINGS"] = "ignore"
    env.update(extra or {})
    return env


def stand_in_agent(script: str, folder: Path) -> subprocess.Popen[str]:
    """``python -c script folder``: a stand-in agent driving a real ``WorkerGroup``;
    its stdout (the workers' prefixed lines) read as text."""
    cmd = [PYTHON, "-c", script, str(folder)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=child_env())


def spawn(cmd: list[str], name: str, env: dict[str, str] | None = None) -> LineLog:
    """``cmd`` with its merged output read line by line; ``env`` on top of :func:`child_env`."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env(env)
    )
    return LineLog(proc, name)


def start_store(port: int = 0, timeout: float = 60.0) -> tuple[subprocess.Popen[str], int, LineLog]:
    log = spawn([AGENT_BIN, "store", "--host", "127.0.0.1", "--port", str(port)], "store")
    try:
        _, line = log.wait_for(lambda s: "listening on" in s, timeout)
    except AssertionError:
        stop_process(log.proc)
        raise
    return log.proc, int(line.rsplit(":", 1)[1]), log


def start_etcd(
    data_dir: Path, timeout: float = 30.0, client: int = 0, peer: int = 0
) -> tuple[subprocess.Popen[bytes], int]:
    """A real etcd on 127.0.0.1 (given ports, e.g. to restart it in place, or free ones)."""
    client, peer = client or free_port(), peer or free_port()
    proc = subprocess.Popen(
        [
            pinned_binary("etcd"),
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
    from torchflex_agent.stores.etcd import connect_etcd_with_retry

    try:
        store = connect_etcd_with_retry(
            [("http", "127.0.0.1", client)], None, time.monotonic() + timeout
        )
        store.close()
    except StoreUnavailableError:
        stop_process(proc)
        raise
    return proc, client


class Job:
    """A store process (or an etcd) plus N agents sharing one run id; cleans up by PID.

    Options: ``serve_status`` gives each agent a health port of its own on
    127.0.0.1 (``health[i]``, read with :meth:`status`); ``pod_names`` names
    agent ``i``'s pod ``pod-<i>``; ``agent_env`` goes into every agent's
    environment. Processes a test stops with SIGSTOP go into ``frozen``: they
    are woken before :meth:`close` stops them. A context manager.
    """

    def __init__(
        self,
        tmp: Path,
        *,
        serve_status: bool = False,
        pod_names: bool = False,
        agent_env: Mapping[str, str] | None = None,
    ) -> None:
        self.tmp = tmp
        self.serve_status = serve_status
        self.pod_names = pod_names
        self.agent_env = dict(agent_env or {})
        self.health: list[int] = []
        self.frozen: list[int] = []
        self.run_id = f"it-{uuid.uuid4().hex[:8]}"
        self.ckpt = tmp / "ckpt"
        self.store: subprocess.Popen[str] | None = None
        self.etcd: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.backend = "c10d"
        self.agents: list[LineLog] = []

    def start_store(self, port: int = 0) -> None:
        self.store, self.port, _ = start_store(port)

    def start_etcd(self, data_dir: Path, client: int = 0, peer: int = 0) -> int:
        """A real etcd as the rendezvous backend; returns its peer port (to restart in place)."""
        peer = peer or free_port()
        self.etcd, self.port = start_etcd(data_dir, client=client or self.port, peer=peer)
        self.backend = "etcd"
        return peer

    def kill_store(self) -> float:
        """SIGKILL the store (or etcd) and reap it; the monotonic time it was gone."""
        proc = self.etcd if self.backend == "etcd" else self.store
        assert proc is not None
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        return time.monotonic()

    def agent_options(self, i: int) -> tuple[int, dict[str, str]]:
        """Agent ``i``'s health port (0: none published) and its extra environment."""
        env = dict(self.agent_env)
        if self.pod_names:
            env["TORCHFLEX_POD_NAME"] = f"pod-{i}"
        if not self.serve_status:
            return 0, env
        self.health.append(free_port())
        return self.health[i], env

    def status(self, i: int, path: str = STATUS_PATH, timeout: float = 5.0) -> AgentReport:
        """Agent ``i``'s report from its ``/status`` (or ``path``, e.g. a long poll)."""
        url = f"http://127.0.0.1:{self.health[i]}{path}"
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return AgentReport.from_json(resp.read().decode())

    def status_when(
        self, i: int, pred: Callable[[AgentReport], bool], timeout: float
    ) -> AgentReport:
        """Agent ``i``'s ``/status`` once ``pred`` holds for it (polled, bounded)."""
        last: list[AgentReport | None] = [None]

        def matches() -> bool:
            try:
                last[0] = self.status(i)
            except OSError:  # not listening yet
                last[0] = None
            return last[0] is not None and pred(last[0])

        if not poll_until(matches, timeout, 0.1) or last[0] is None:
            raise AssertionError(f"/status never matched within {timeout}s; last: {last[0]}")
        return last[0]

    def ckpt_meta(self) -> CheckpointMeta:
        return CheckpointMeta.from_json((self.ckpt / "latest.pt.meta").read_text())

    def start_agent(
        self, script_args: list[str], nnodes: str, extra: list[str] | None = None
    ) -> LineLog:
        """Agent ``i`` with its termination log ``termination-<i>.log``; a health port from
        :meth:`agent_options` serves ``/status`` on 127.0.0.1."""
        i = len(self.agents)
        health_port, env = self.agent_options(i)
        health = ["--health-port", str(health_port)]
        if health_port:
            health += ["--health-host", "127.0.0.1"]
        cmd = [
            AGENT_BIN,
            "--nnodes", nnodes,
            "--nproc-per-node", "1",
            "--rdzv-backend", self.backend,
            "--rdzv-endpoint", f"127.0.0.1:{self.port}",
            "--rdzv-id", self.run_id,
            "--rdzv-last-call", "0.5",
            "--rdzv-join-timeout", "60",
            *health,
            "--node-addr", "127.0.0.1",
            "--termination-grace", "15",
            *(extra or []),
            "--",
            *script_args,
        ]  # fmt: skip
        termination = {"TORCHFLEX_TERMINATION_LOG": str(self.tmp / f"termination-{i}.log")}
        log = spawn(cmd, f"agent{i}", {**termination, **env})
        self.agents.append(log)
        return log

    def train_together(
        self, count: int, nnodes: str, until: str, timeout: float, steps: int = 400
    ) -> list[LineLog]:
        """A store and ``count`` agents training the example, once each printed a line
        matching the regular expression ``until``."""
        self.start_store()
        logs = [self.start_agent(self.train_args(steps), nnodes) for _ in range(count)]
        for log in logs:
            log.wait_for(lambda s: re.search(until, s) is not None, timeout)
        return logs

    def train_args(self, steps: int = 400) -> list[str]:
        return [PYTHON, EXAMPLE, "--steps", str(steps), "--step-time", "0.1",
                "--ckpt-dir", str(self.ckpt), "--ckpt-every", "5"]  # fmt: skip

    def termination_report(self, i: int) -> AgentReport:
        return AgentReport.from_json((self.tmp / f"termination-{i}.log").read_text())

    def close(self) -> None:
        for pid in self.frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.frozen = []
        for a in self.agents:
            stop_process(a.proc, grace=20)
        if self.store is not None:
            stop_process(self.store)
        if self.etcd is not None:
            stop_process(self.etcd)

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def steps_of(log: LineLog, after: float = 0.0) -> list[tuple[float, int, int]]:
    """(time, step, world) of this agent's step lines."""
    out = []
    for t, m in log.matching(STEP.pattern):
        if t >= after:
            out.append((t, int(m.group(2)), int(m.group(3))))
    return out


def node_rank(log: LineLog) -> int:
    _, line = log.wait_for(lambda s: "node rank" in s, 5)
    m = re.search(r"node rank (\d+)", line)
    assert m
    return int(m.group(1))


def worker_pids(log: LineLog) -> list[int]:
    """The PIDs of the workers the agent says it started (its "pids" line)."""
    _, line = log.wait_for(lambda s: "pids" in s, 5)
    return [int(p) for p in re.findall(r"\d+", line.split("pids")[1])]


def pid_alive(pid: int, wait: float) -> bool:
    """Whether ``pid`` still exists (not a zombie) after up to ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            status = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except OSError:
            return False
        if status == "Z":
            return False
        time.sleep(0.05)
    return True


def preempt(logs: Sequence[LineLog], timeout: float) -> list[int]:
    """SIGTERM every agent (as the kubelet does), then their exit codes."""
    for log in logs:
        log.proc.send_signal(signal.SIGTERM)
    return [log.proc.wait(timeout) for log in logs]
