"""Real process-level training jobs on loopback, for the recovery and preemption benchmarks.

Where it sits: ``benchmarks.recovery`` and ``benchmarks.preemption`` start a
``ProcJob`` per repetition: N launcher processes (``torchflex-agent`` with a
``torchflex-agent store`` process, or stock ``torchrun`` with its c10d
rendezvous) that each run one worker of ``examples/train_elastic.py
--print-time``. This module does the I/O (spawn, collect output lines,
signal process trees); the arithmetic is in ``benchmarks._proc_logs``.

Rules it keeps: every process is started here and stopped by PID (the whole
tree it spawned, read from ``/proc`` before signalling); every wait is
bounded; everything listens on and dials 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from benchmarks._proc_logs import StepLine, parse_steps, pick_victim
from e2e.kubelet import records
from e2e.localproc import LineLog, free_port
from e2e.polling import poll_until

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
AGENT_BIN = str(VENV_BIN / "torchflex-agent")
TORCHRUN_BIN = str(VENV_BIN / "torchrun")
EXAMPLE = str(REPO / "examples" / "train_elastic.py")
# The same training adopting the state API (issue 18): same CLI and step lines.
STATEFUL = str(REPO / "examples" / "train_stateful.py")

# torchrun's rendezvous settings. "default" changes nothing that affects
# timing; max restarts must be > 0 for any recovery (its default 0 fails the
# job on the first peer loss), and the shared store is disabled because with
# it a scale-up join can deadlock (DESIGN.md). "tuned" is the fastest that
# torchrun's integer-second settings allow without evicting healthy nodes on
# a busy machine: 1 s keep-alive, eviction after 2 missed (2 s), 1 s last call.
TORCHRUN_CONF = {
    "default": "",
    "tuned": "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=2",
}
TORCHRUN_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def signal_tree(pid: int, sig: signal.Signals) -> None:
    """Signal ``pid`` and every process it spawned (a pod's container dying)."""
    for p in records.process_tree(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, sig)


class Lines(LineLog):
    """A launcher's merged output; lines carry wall time, as the workers' step lines do."""

    def __init__(self, proc: subprocess.Popen[str], name: str) -> None:
        super().__init__(proc, name, clock=time.time)

    def steps(self) -> list[StepLine]:
        return parse_steps(self.texts())


@dataclasses.dataclass(frozen=True)
class Flavor:
    """Which launcher runs the job: ``torchflex`` or ``torchrun-default``/``torchrun-tuned``."""

    name: str

    @property
    def is_torchrun(self) -> bool:
        return self.name.startswith("torchrun")


def _run_id() -> str:
    return f"bench-{os.getpid()}-{time.monotonic_ns() % 10**9}"


@dataclasses.dataclass(eq=False)
class ProcJob:
    """One elastic job of real launcher processes; ``close()`` kills all it started."""

    flavor: Flavor
    workdir: Path
    _: dataclasses.KW_ONLY
    nnodes: str = "2:3"
    step_time: float = 0.1
    ckpt_every: int = 10
    sigterm_hook: bool = True
    agent_args: Sequence[str] = ()
    script: str = EXAMPLE
    """The training script (same CLI as the example's); goodput's state launcher changes it."""
    extra_env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """More environment for every launcher (the hang benchmark's staged fault)."""
    run_id: str = dataclasses.field(init=False, default_factory=_run_id)
    port: int = dataclasses.field(init=False, default_factory=free_port)
    store: Lines | None = dataclasses.field(init=False, default=None)
    nodes: list[Lines] = dataclasses.field(init=False, default_factory=list)

    @property
    def ckpt(self) -> Path:
        return self.workdir / "ckpt"

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHFLEX_")}
        env.update(
            PYTHONUNBUFFERED="1",
            PYTHONWARNINGS="ignore",
            OMP_NUM_THREADS="1",
            TRAIN_PRINT_TIME="1",
        )
        if not self.sigterm_hook:
            env["TRAIN_NO_SIGTERM_HOOK"] = "1"
        if self.flavor.is_torchrun:
            env.update(TORCHRUN_ENV)
        env.update(self.extra_env)
        return env

    def _script(self) -> list[str]:
        return [
            self.script, "--steps", "1000000", "--step-time", str(self.step_time),
            "--ckpt-dir", str(self.ckpt), "--ckpt-every", str(self.ckpt_every),
        ]  # fmt: skip

    def _spawn(self, cmd: list[str], name: str, env: dict[str, str]) -> Lines:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
            start_new_session=True,
            text=True,
            errors="replace",
        )
        return Lines(proc, name)

    def start_store(self) -> None:
        if self.flavor.is_torchrun:
            return  # torchrun's node 0 hosts its rendezvous store
        cmd = [AGENT_BIN, "store", "--host", "127.0.0.1", "--port", str(self.port)]
        self.store = store = self._spawn(cmd, "store", self._env())
        if not poll_until(lambda: any("listening on" in x for x in store.texts()), 60, 0.05):
            raise RuntimeError("store did not start: " + "\n".join(store.texts()[-10:]))

    def start_node(self) -> Lines:
        i = len(self.nodes)
        endpoint = f"127.0.0.1:{self.port}"
        if self.flavor.is_torchrun:
            conf = ",".join(x for x in (f"is_host={1 if i == 0 else 0}", self._conf()) if x)
            cmd = [
                TORCHRUN_BIN, "--nnodes", self.nnodes, "--nproc-per-node", "1",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
                "--rdzv-id", self.run_id, "--rdzv-conf", conf, "--max-restarts", "100",
                *self._script(),
            ]  # fmt: skip
        else:
            cmd = [
                AGENT_BIN, "--nnodes", self.nnodes, "--nproc-per-node", "1",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
                "--rdzv-id", self.run_id, "--health-port", "0", "--max-restarts", "100",
                *self.agent_args, "--", sys.executable, *self._script(),
            ]  # fmt: skip
        node = self._spawn(cmd, f"node{i}", self._env())
        self.nodes.append(node)
        return node

    def start_training(self, nodes: int, warm_steps: int, timeout: float) -> bool:
        """Start the store and ``nodes`` launchers; True once all trained ``warm_steps`` steps."""
        self.start_store()
        for i in range(nodes):
            self.start_node()
            if i == 0 and self.flavor.is_torchrun:
                time.sleep(0.5)  # node 0 binds torchrun's store before the others dial it
        return self.wait_training(self.nodes, nodes, 0.0, warm_steps, timeout)

    def victim(self) -> tuple[Lines, list[Lines]]:
        """The node to stop (``_proc_logs.pick_victim``) and the survivors."""
        world = len(self.nodes)
        protected = {0} if self.flavor.is_torchrun else set()
        victim = self.nodes[pick_victim(self.current_ranks(self.nodes, world), protected)]
        return victim, [n for n in self.nodes if n is not victim]

    def _conf(self) -> str:
        return TORCHRUN_CONF["tuned" if self.flavor.name.endswith("tuned") else "default"]

    def live_nodes(self) -> list[Lines]:
        return [n for n in self.nodes if n.proc.poll() is None]

    def wait_training(self, nodes: Sequence[Lines], world: int, after: float, min_steps: int,
                      timeout: float) -> bool:  # fmt: skip
        """Every node in ``nodes`` completed ``min_steps`` steps at ``world`` after ``after``."""

        def ready() -> bool:
            for n in nodes:
                if n.proc.poll() is not None:
                    return False
                got = [s for s in n.steps() if s.world == world and s.t > after]
                if len(got) < min_steps:
                    return False
            return True

        return bool(poll_until(ready, timeout, 0.1))

    def current_ranks(self, nodes: Sequence[Lines], world: int) -> list[int | None]:
        out: list[int | None] = []
        for n in nodes:
            mine = [s for s in n.steps() if s.world == world]
            out.append(mine[-1].rank if mine else None)
        return out

    def close(self) -> None:
        for n in self.nodes:
            if n.proc.poll() is None:
                signal_tree(n.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                n.proc.wait(10)
        if self.store is not None and self.store.proc.poll() is None:
            self.store.proc.kill()
            self.store.proc.wait(10)
