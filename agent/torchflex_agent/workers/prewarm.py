"""Warm workers: the agent's side of the fork server (``workers.zygote``).

Where it sits: ``loop.agent.ElasticAgent`` starts one ``ForkServer`` at start-up
when the training command is a Python script or module
(``python_launch`` decides; anything else is spawned the normal way), and
``workers.group.WorkerGroup`` asks it for each worker instead of ``Popen``.
The zygote imports torch (and the script's other top-level imports) while
the agent is still connecting and rendezvousing, so a re-formed group's
workers start in milliseconds (a fork) instead of 1.5-3 s (a new
interpreter importing torch).

Process tree: agent -> zygote (``PR_SET_PDEATHSIG`` to the agent) -> workers
(own sessions, ``PR_SET_PDEATHSIG`` to the zygote). If the agent dies the
zygote dies, and the workers with it. The zygote reaps its children and
reports their exit codes; ``ForkedProc`` gives them the ``Popen`` methods
the worker group uses (``pid``, ``poll``, ``wait``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torchflex_agent.workers import zygote

log = logging.getLogger(__name__)

_PYTHON = re.compile(r"^python(\d+(\.\d+)*)?$")
# Interpreter options that take no value / one value; anything else means we
# do not understand the command line and spawn it the normal way.
_FLAG_OPTS = frozenset({"-u", "-O", "-OO", "-B", "-s", "-S", "-E", "-I", "-b", "-bb", "-q", "-v"})
_VALUE_OPTS = frozenset({"-W", "-X"})
_SPAWN_REPLY_TIMEOUT = 300.0
_ZYGOTE_KILLED = -int(signal.SIGKILL)


@dataclasses.dataclass(frozen=True)
class PythonLaunch:
    """A command ``python [opts] script.py args`` or ``python [opts] -m module args``."""

    interpreter: str
    options: tuple[str, ...]
    argv: tuple[str, ...]
    """What follows the options: ``(script, args...)`` or ``("-m", module, args...)``."""

    @property
    def target(self) -> dict[str, str]:
        if self.argv[0] == "-m":
            return {"kind": "module", "target": self.argv[1]}
        return {"kind": "path", "target": self.argv[0]}


def python_launch(cmd: Sequence[str]) -> PythonLaunch | None:
    """The parsed command if a fork server can run it, else None (spawn normally)."""
    if not cmd or not _PYTHON.match(os.path.basename(cmd[0])):
        return None
    opts: list[str] = []
    i = 1
    while i < len(cmd):
        arg = cmd[i]
        if arg in _FLAG_OPTS:
            opts.append(arg)
            i += 1
        elif arg in _VALUE_OPTS and i + 1 < len(cmd):
            opts += [arg, cmd[i + 1]]
            i += 2
        elif arg == "-m" and i + 1 < len(cmd):
            return PythonLaunch(cmd[0], tuple(opts), tuple(cmd[i:]))
        elif arg.startswith("-"):
            return None  # -c, -, -i, combined flags...: not ours to emulate
        else:
            return PythonLaunch(cmd[0], tuple(opts), tuple(cmd[i:]))
    return None


class ZygoteGoneError(Exception):
    """The fork server is not running (crashed or never started); spawn normally."""


class ForkedProc:
    """A worker forked by the zygote, with the ``Popen`` methods ``WorkerGroup`` uses."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self._server = server
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        code = self._server.wait_exit(self.pid, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0.0)
        self.returncode = code
        return code


class ForkServer:
    """One zygote process per agent; ``spawn`` must be called from the main thread."""

    def __init__(self, launch: PythonLaunch, env: Mapping[str, str], preexec: Any = None) -> None:
        self.launch = launch
        self._sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        source = Path(zygote.__file__).read_text()
        cmd = [
            launch.interpreter,
            *launch.options,
            "-c",
            source,
            str(child.fileno()),
            json.dumps(launch.target),
        ]
        self.proc = subprocess.Popen(
            cmd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            pass_fds=(child.fileno(),),
            start_new_session=True,
            preexec_fn=preexec,  # noqa: PLW1509 - prctl must run in the child
        )
        child.close()
        self.started = time.monotonic()
        self.ready_after: float | None = None
        self._cond = threading.Condition()
        self._replies: dict[int, dict[str, Any]] = {}
        self._exits: dict[int, int] = {}
        self._gone = False
        self._next_id = 0
        self._reader = threading.Thread(target=self._read, daemon=True, name="zygote")
        self._reader.start()

    def _read(self) -> None:
        try:
            while True:
                data = self._sock.recv(1 << 16)
                if not data:
                    break
                msg = json.loads(data)
                with self._cond:
                    op = msg.get("op")
                    if op == "ready":
                        self.ready_after = time.monotonic() - self.started
                        log.info("worker fork server ready (preloaded in %.2fs)", self.ready_after)
                    elif op == "exit":
                        self._exits[int(msg["pid"])] = int(msg["code"])
                    elif op in ("spawned", "failed"):
                        self._replies[int(msg["id"])] = msg
                    self._cond.notify_all()
        except (OSError, ValueError) as exc:
            log.warning("worker fork server channel closed: %s", exc)
        finally:
            with self._cond:
                self._gone = True
                self._cond.notify_all()

    def wait_ready(self, timeout: float) -> bool:
        """True once the zygote has preloaded (False on timeout or if it is gone)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.ready_after is None and not self._gone:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return self.ready_after is not None

    @property
    def alive(self) -> bool:
        with self._cond:
            return not self._gone and self.proc.poll() is None

    def spawn(self, env: Mapping[str, str], stdout_fd: int, stderr_fd: int) -> ForkedProc:
        """Fork a worker running the launch's script with ``env``; raises ``ZygoteGoneError``."""
        with self._cond:
            if self._gone:
                raise ZygoteGoneError("fork server is gone")
            self._next_id += 1
            rid = self._next_id
        req = {
            "op": "spawn",
            "id": rid,
            "env": dict(env),
            "argv": list(self.launch.argv),
            "cwd": os.getcwd(),
        }
        try:
            socket.send_fds(self._sock, [json.dumps(req).encode()], [stdout_fd, stderr_fd])
        except OSError as exc:
            raise ZygoteGoneError(f"fork server unreachable: {exc}") from exc
        deadline = time.monotonic() + _SPAWN_REPLY_TIMEOUT
        with self._cond:
            while rid not in self._replies:
                left = deadline - time.monotonic()
                if self._gone or left <= 0:
                    raise ZygoteGoneError("fork server did not answer")
                self._cond.wait(left)
            reply = self._replies.pop(rid)
        if reply["op"] != "spawned":
            raise ZygoteGoneError(f"fork server could not fork: {reply.get('message')}")
        return ForkedProc(self, int(reply["pid"]))

    def exit_code(self, pid: int) -> int | None:
        with self._cond:
            if pid in self._exits:
                return self._exits[pid]
            # The zygote's death kills its workers (parent-death signal).
            return _ZYGOTE_KILLED if self._gone else None

    def wait_exit(self, pid: int, timeout: float | None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                code = self._exits.get(pid, _ZYGOTE_KILLED if self._gone else None)
                if code is not None:
                    return code
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._cond.wait(left)

    def close(self) -> None:
        """Stop the zygote (its workers die with it)."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)
        self._sock.close()
        self._reader.join(2.0)
