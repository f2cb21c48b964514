"""The real operator as a separate process, and the real processes behind a pod.

Where it sits: the e2e scenarios, ``make demo``, the operator's integration
tests (its metrics, two replicas electing a leader) and the benchmarks run
``torchflex-operator`` exactly as a user would (its console script, its
flags, a kubeconfig), so killing and restarting it is a real SIGKILL of a
real process. :class:`OperatorProcess` is the one wrapper; its options are
what those callers differ in (standalone or electing on a Lease, backoff
tuning, metrics port, extra environment and flags). The scenarios also
need the processes a pod runs on the process kubelet (to SIGKILL an agent
like a node death would): :func:`pod_processes` finds them by the pod
identity the operator injects into their environment. Only processes this
harness started are ever signalled, always by PID.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from e2e.cluster.layout import REPO_ROOT
from e2e.kubelet.records import read_stat
from e2e.localproc import stop_process
from e2e.polling import poll_until
from torchflex_contract import env as contract_env

OPERATOR_BIN = REPO_ROOT / ".venv" / "bin" / "torchflex-operator"

PROMPT_RECOVERY = ("--backoff-base", "0.5", "--backoff-cap", "5", "--force-delete-after", "5")
"""Short backoff so the scenarios' replacements are prompt; the defaults are for
production clusters (a benchmark measuring the operator as shipped passes ``()``)."""


class OperatorProcess:
    """``torchflex-operator`` watching some namespaces, logging to a file.

    ``standalone``: no leader election (else the Lease flags go in
    ``extra_args``); ``tuning``: the backoff flags; ``metrics_port``: 0 for
    none; ``env``: on top of ours, whose ``KUBECONFIG`` decides the cluster
    (an in-pod ``KUBERNETES_*`` environment is dropped, so it never does).
    """

    def __init__(
        self,
        kubeconfig: Path,
        namespaces: Sequence[str],
        log_path: Path,
        extra_args: Sequence[str] = (),
        *,
        standalone: bool = True,
        tuning: Sequence[str] = PROMPT_RECOVERY,
        metrics_port: int = 0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.namespaces = list(namespaces)
        self.log_path = log_path
        self.extra_args = list(extra_args)
        self.standalone = standalone
        self.tuning = list(tuning)
        self.metrics_port = metrics_port
        self.env = dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        out = [str(OPERATOR_BIN)] + (["--standalone"] if self.standalone else [])
        out += ["--metrics-port", str(self.metrics_port), "--health-port", "0"]
        for ns in self.namespaces:
            out += ["--namespace", ns]
        return out + self.tuning + self.extra_args

    def environ(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
        return {**env, "KUBECONFIG": str(self.kubeconfig), **self.env}

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def start(self) -> OperatorProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = self.environ()
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv(),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no cleanup, no goodbye (a crashed or evicted operator)."""
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self, grace_s: float = 10.0) -> None:
        if self.proc is not None:
            stop_process(self.proc, grace=grace_s)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def __enter__(self) -> OperatorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def processes_with_env(wanted: dict[str, str]) -> list[int]:
    """PIDs of every process whose environment holds all of ``wanted``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        found = _environ(int(entry.name))
        if all(found.get(k) == v for k, v in wanted.items()):
            pids.append(int(entry.name))
    return sorted(pids)


def pod_processes(namespace: str, pod: str) -> list[int]:
    """PIDs of every process a pod runs here (its agent and the agent's workers).

    The operator injects the pod's namespace and name into the trainer's
    environment; the process kubelet runs it, and workers inherit it.
    """
    return processes_with_env({contract_env.POD_NAME: pod, contract_env.NAMESPACE: namespace})


def sigkill_pod_processes(namespace: str, pod: str) -> list[int]:
    """SIGKILL a pod's agent and workers at once, like a machine dying."""
    pids = pod_processes(namespace, pod)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def _dead(pid: int) -> bool:
    """No such process, or a zombie: it has exited (its sockets closed, its memory
    freed) and only its reaping is left. A killed agent's children are orphans,
    reaped by PID 1, which here (a VM's init) does that 1.0-2.0 s after their death."""
    st = read_stat(pid)
    return st is None or st.state in ("Z", "X")


def wait_gone(pids: Sequence[int], timeout_s: float = 10.0) -> bool:
    """Whether every one of ``pids`` has exited within ``timeout_s`` (polled, bounded)."""
    return bool(poll_until(lambda: all(_dead(p) for p in pids), timeout_s, 0.05))
