"""Worker processes of one round: environment, launch, log prefixing, exit status.

Where it sits: the agent builds a ``WorkerGroup`` for each round it is a
member of and polls it; this module knows nothing about the store. Workers
are plain ``subprocess.Popen`` children in their own session (so a group can
be signalled as a whole) that get ``PR_SET_PDEATHSIG=SIGKILL``: if the agent
dies, even by SIGKILL, its workers die with it instead of training on as
orphans. Their env is the one torchrun gives (``worker_env``) plus
torchflex's own (``env.ERROR_FILE``, ``env.PROGRESS_FILE``, see
``progress``). Each worker's error file is also torch's
(``TORCHELASTIC_ERROR_FILE``), so scripts using
``torch.distributed.elastic.multiprocessing.errors.record`` report their
exception to us unchanged, and the fork server's bootstrap records any
other uncaught exception there; a failed worker's root cause is read from it
(or from the last traceback on its stderr, ``rootcause``).

Popen must be called from the agent's main thread: the kernel sends the
parent-death signal when the *thread* that forked exits.

A command that cannot start at all (``command_problem``: executable missing
or not executable, python's script missing) is ``CommandNotRunnableError``
before anything is spawned, and so is an exec that fails the same way;
the agent turns it into exit 127 instead of a retry.

When the agent runs a fork server (``prewarm``), workers are forked by it
instead (torch already imported); they look the same to this module
(``ForkedProc`` has the ``Popen`` methods used here) and fall back to
``Popen`` if the fork server is gone.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import dataclasses
import errno
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Protocol

from torchflex_agent.errors import CommandNotRunnableError, LaunchError, SpawnFailedError
from torchflex_agent.pulse import Pulse, read_pulse
from torchflex_agent.rendezvous.logic import RendezvousResult
from torchflex_agent.workers import hangs, rootcause
from torchflex_agent.workers.logic import GroupState
from torchflex_agent.workers.prewarm import ForkServer, ZygoteGoneError, python_launch
from torchflex_agent.workers.roster import format_role_ranks
from torchflex_contract import env as tfenv
from torchflex_contract.progress import HangKind, HangReport, RootCause
from torchflex_contract.roles import DEFAULT_ROLE

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
# Lines of each worker's stderr kept for a traceback when it wrote no error file.
_STDERR_TAIL_LINES = 200
# How long failed workers' stderr may take to reach EOF before their tails are read.
_STDERR_DRAIN_S = 0.5
# How long a stopped group's output may take to reach ours, all copiers together: the
# next round's header must follow the last line of this one (a reader of the pod's log
# orders rounds by it). Only a descendant that outlives the worker holding its pipe
# makes this wait in full.
_OUTPUT_DRAIN_S = 5.0


@dataclasses.dataclass(frozen=True)
class LaunchContext:
    """What every worker env needs besides the round itself."""

    run_id: str
    restart_count: int
    max_restarts: int
    nproc: int
    error_dir: Path
    state_dir: Path | None = None
    """The agent's in-memory folder for the state API's copies (``memstate.shm``)."""
    teardown_grace: float = tfenv.DEFAULT_TEARDOWN_GRACE_S
    """Seconds a worker whose script returned may take to exit (``finished_file``)."""
    role: str = DEFAULT_ROLE
    """The workers' ``ROLE_NAME`` (``--role``)."""
    joint: bool = False
    """The round spans every role (Joint): ``RANK``/``WORLD_SIZE`` are global,
    ``ROLE_RANK``/``ROLE_WORLD_SIZE`` per role, and ``env.ROLE_RANKS`` lists them."""
    roles_file: Path | None = None
    """The agent's roles file (``workers.roster``), named in ``env.ROLES_FILE``."""


def worker_env(
    base: Mapping[str, str], result: RendezvousResult, ctx: LaunchContext, local_rank: int
) -> dict[str, str]:
    """The environment torchrun gives local worker ``local_rank`` of this round."""
    rank = result.rank_offset + local_rank
    role_rank, role_world = rank, result.world_size
    if ctx.joint:  # torchrun --role: ranks counted within the role, in node order
        role_rank, role_world = result.role_rank_offset + local_rank, result.role_world_size
    env = worker_base_env(base)
    env.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(result.world_size),
            "LOCAL_WORLD_SIZE": str(ctx.nproc),
            "GROUP_RANK": str(result.node_rank),
            "GROUP_WORLD_SIZE": str(result.num_nodes),
            "ROLE_RANK": str(role_rank),
            "ROLE_WORLD_SIZE": str(role_world),
            "ROLE_NAME": ctx.role,
            "MASTER_ADDR": result.master.addr,
            "MASTER_PORT": str(result.master.port),
            "TORCHELASTIC_RESTART_COUNT": str(ctx.restart_count),
            "TORCHELASTIC_MAX_RESTARTS": str(ctx.max_restarts),
            "TORCHELASTIC_RUN_ID": ctx.run_id,
            "TORCHELASTIC_USE_AGENT_STORE": str(result.master.agent_store),
            "TORCHELASTIC_ERROR_FILE": str(error_file(ctx, result.round, rank)),
            tfenv.ERROR_FILE: str(error_file(ctx, result.round, rank)),
            tfenv.PROGRESS_FILE: str(progress_file(ctx.error_dir)),
            tfenv.FINISHED_FILE: str(finished_file(ctx, result.round, rank)),
            tfenv.STACK_FILE: str(stack_file(ctx, result.round, rank)),
            tfenv.PULSE_FILE: str(pulse_file(ctx, result.round, rank)),
        }
    )
    if ctx.state_dir is not None:
        env[tfenv.STATE_DIR] = str(ctx.state_dir)
    ports = result.me.service_ports
    if local_rank < len(ports):
        env[tfenv.SERVICE_PORT] = str(ports[local_rank])
    if ctx.roles_file is not None:
        env[tfenv.ROLES_FILE] = str(ctx.roles_file)
    if ctx.joint:
        env[tfenv.ROLE_RANKS] = format_role_ranks(result.nodes)
    return env


def worker_base_env(base: Mapping[str, str]) -> dict[str, str]:
    """The part of every worker's env that no round changes.

    The fork server is started with it: libraries read some of it once, at
    import (OpenMP reads ``OMP_NUM_THREADS`` when torch loads it).
    """
    env = dict(base)
    env["PYTHONUNBUFFERED"] = base.get("PYTHONUNBUFFERED", "1")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def start_fork_server(command: Sequence[str], environ: Mapping[str, str]) -> ForkServer | None:
    """The fork server for ``command`` (None: not a Python command, or it could not start).

    From the main thread (parent-death signal). The agent calls it first
    thing, before its own imports and its GPU count (which imports torch when
    no GPU limit is given): the zygote's imports are the longest part of a
    new node's start, so every earlier step it waits for delays a join.
    """
    launch = python_launch(command)
    if launch is None:
        return None
    try:
        return ForkServer(launch, worker_base_env(environ), set_pdeathsig)
    except OSError as exc:
        log.warning("no worker fork server (workers spawn cold): %s", exc)
        return None


# What an exec of the training command fails with when the command itself is
# wrong (missing, not executable, not a program): the same on every attempt.
_COMMAND_ERRNOS = frozenset(
    {errno.ENOENT, errno.EACCES, errno.ENOEXEC, errno.ENOTDIR, errno.EISDIR, errno.ELOOP,
     errno.ENAMETOOLONG, errno.EPERM}
)  # fmt: skip
_SHOWN_COMMAND_CHARS = 160


def _shown(cmd: Sequence[str]) -> str:
    text = shlex.join(cmd)
    return text if len(text) <= _SHOWN_COMMAND_CHARS else text[: _SHOWN_COMMAND_CHARS - 3] + "..."


def command_problem(cmd: Sequence[str], env: Mapping[str, str]) -> str | None:
    """Why ``cmd`` cannot start here (one line naming it), or None if it can.

    The executable is looked up as ``Popen`` will: on the workers' ``PATH``
    unless it names a path (relative to the working directory workers
    inherit). For ``python [opts] script.py`` the script must exist and be
    readable: python would exit 2 with "can't open file", and the fork
    server would raise the same in every worker. Not checked: what only the
    interpreter knows (``python -m`` of a missing module, a script that
    raises) -- that is the workers' own failure, under the restart budget.
    """
    if not cmd:
        return "the training command is empty"
    name = cmd[0]
    path = env.get("PATH", os.defpath)
    if shutil.which(name, path=path) is None:
        if os.sep in name:
            candidates = [name]
        else:
            candidates = [os.path.join(d or os.curdir, name) for d in path.split(os.pathsep)]
        found = next((c for c in candidates if os.path.exists(c)), None)
        if found is None:
            where = "no such file" if os.sep in name else "not found on PATH"
            return f"cannot start the training command {_shown(cmd)!r}: {name!r} {where}"
        return (
            f"cannot start the training command {_shown(cmd)!r}: {found!r} is not an "
            "executable file"
        )
    launch = python_launch(cmd)
    if launch is not None and launch.argv[0] != "-m":
        script = launch.argv[0]
        why = None
        if not os.path.exists(script):
            why = os.strerror(errno.ENOENT)
        elif not os.access(script, os.R_OK):
            why = os.strerror(errno.EACCES)
        if why is not None:
            return (
                f"cannot start the training command {_shown(cmd)!r}: python cannot open "
                f"{script!r} ({why})"
            )
    return None


def launch_error(cmd: Sequence[str], exc: OSError) -> LaunchError:
    """The typed error for an ``OSError`` from starting a worker process."""
    if exc.errno in _COMMAND_ERRNOS:
        what = exc.strerror or type(exc).__name__
        return CommandNotRunnableError(f"cannot start the training command {_shown(cmd)!r}: {what}")
    return SpawnFailedError(f"cannot start a worker process: {exc}")


def error_file(ctx: LaunchContext, round_no: int, rank: int) -> Path:
    return ctx.error_dir / f"round_{round_no}" / f"rank_{rank}" / "error.json"


def finished_file(ctx: LaunchContext, round_no: int, rank: int) -> Path:
    return error_file(ctx, round_no, rank).with_name("finished.json")


def stack_file(ctx: LaunchContext, round_no: int, rank: int) -> Path:
    return error_file(ctx, round_no, rank).with_name("stacks.txt")


def pulse_file(ctx: LaunchContext, round_no: int, rank: int) -> Path:
    return error_file(ctx, round_no, rank).with_name("pulse.bin")


def read_finished(path: Path) -> tuple[int, float] | None:
    """(exit code, unix time) a worker's bootstrap wrote when its script returned."""
    try:
        data = json.loads(path.read_text())
        return int(data["code"]), float(data["timestamp"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def progress_file(error_dir: Path) -> Path:
    """One per agent, kept across rounds: the last reported step stays known."""
    return error_dir / "progress.json"


def read_error_file(path: Path) -> str | None:
    """The ``Type: message`` the worker's error file records, or None if it wrote none."""
    recorded = rootcause.read_error_file(path)
    if recorded is None:
        return None
    return recorded.summary()


class _Proc(Protocol):
    pid: int

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def set_pdeathsig() -> None:
    """Runs in the child between fork and exec."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@dataclasses.dataclass(frozen=True)
class WorkerFailure:
    rank: int
    exitcode: int
    message: str
    cause: RootCause | None = None
    """The worker's exception, if its error file or stderr recorded one."""

    def describe(self) -> str:
        how = (
            f"killed by {signal.Signals(-self.exitcode).name}"
            if self.exitcode < 0 and -self.exitcode in signal.valid_signals()
            else f"exit code {self.exitcode}"
        )
        return (
            f"rank {self.rank} failed ({how}): {self.message}"
            if self.message
            else (f"rank {self.rank} failed ({how})")
        )


def first_failure(failures: Sequence[WorkerFailure]) -> WorkerFailure:
    """The failure whose worker recorded its exception first (else the lowest rank's)."""
    earliest = rootcause.first(f.cause for f in failures if f.cause is not None)
    return next((f for f in failures if f.cause is earliest), failures[0])


def _prefix(rank: str) -> bytes:
    return f"[rank {rank}] ".encode()


class _Prefixer:
    """Copies a worker's output to ours line by line, prefixed with its rank."""

    _lock = threading.Lock()

    def __init__(self, stream: IO[bytes], out: IO[bytes], prefix: bytes, tail: int = 0) -> None:
        self.tail: collections.deque[bytes] = collections.deque(maxlen=tail)
        """The last ``tail`` lines (a traceback to read if the worker fails)."""
        self.prefix = prefix
        """Replaced when the worker is kept for a round that gives it another rank."""
        self._thread = threading.Thread(
            target=self._run, args=(stream, out), daemon=True, name="log"
        )
        self._thread.start()

    def _run(self, stream: IO[bytes], out: IO[bytes]) -> None:
        with stream:
            for line in iter(stream.readline, b""):
                if self.tail.maxlen:
                    self.tail.append(line)
                with self._lock:
                    end = b"" if line.endswith(b"\n") else b"\n"
                    out.write(self.prefix + line + end)
                    out.flush()

    def tail_lines(self, drain: float) -> list[str]:
        """The kept lines, after waiting up to ``drain`` seconds for the stream's end."""
        self._thread.join(drain)
        return [line.decode("utf-8", "replace").rstrip("\n") for line in list(self.tail)]

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        """Still copying: the worker's end of the pipe is open somewhere."""
        return self._thread.is_alive()


class WorkerGroup:
    """The ``nproc`` worker processes this node runs for one round."""

    def __init__(
        self,
        cmd: Sequence[str],
        result: RendezvousResult,
        ctx: LaunchContext,
        base_env: Mapping[str, str],
        forkserver: ForkServer | None = None,
    ) -> None:
        self._cmd = list(cmd)
        self._result = result
        self._ctx = ctx
        self._base_env = base_env
        self._forkserver = forkserver
        self._procs: list[_Proc] = []
        self._stdout: list[_Prefixer] = []
        self._stderr: list[_Prefixer] = []
        """Per local rank: its stderr copier, which keeps the tail."""
        self._failed: dict[int, WorkerFailure] = {}
        """Per local rank, once read: an exited worker's failure does not change."""
        self._files: list[tuple[Path, Path, Path]] = []
        """Per local rank: its finished and stack files (fixed at start: a kept
        worker's environment cannot change)."""
        self._ended: dict[int, int] = {}
        """Per local rank: the exit code of a worker ended after a teardown hang."""
        self.hang: HangReport | None = None
        """The first worker of this group ended because it would not exit."""
        self.forked = 0
        """How many of this round's workers came from the fork server."""

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    @property
    def round(self) -> int:
        """The round these workers run for (a kept group's latest)."""
        return self._result.round

    def start(self) -> None:
        """Start every worker; raises ``LaunchError`` (the caller stops those started)."""
        problem = command_problem(self._cmd, self._base_env)
        if problem is not None:
            raise CommandNotRunnableError(problem)
        for local_rank in range(self._ctx.nproc):
            env = worker_env(self._base_env, self._result, self._ctx, local_rank)
            efile = Path(env["TORCHELASTIC_ERROR_FILE"])
            efile.parent.mkdir(parents=True, exist_ok=True)
            efile.unlink(missing_ok=True)
            files = (
                Path(env[tfenv.FINISHED_FILE]),
                Path(env[tfenv.STACK_FILE]),
                Path(env[tfenv.PULSE_FILE]),
            )
            for path in files:
                path.unlink(missing_ok=True)
            self._files.append(files)
            forked = self._fork(env)
            if forked is not None:
                proc, stdout, stderr = forked
                self.forked += 1
            else:
                try:
                    popen = subprocess.Popen(
                        self._cmd,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        start_new_session=True,
                        preexec_fn=set_pdeathsig,  # noqa: PLW1509 - prctl must run in the child
                    )
                except OSError as exc:
                    raise launch_error(self._cmd, exc) from exc
                assert popen.stdout is not None and popen.stderr is not None
                proc, stdout, stderr = popen, popen.stdout, popen.stderr
            prefix = _prefix(env["RANK"])
            err = _Prefixer(stderr, sys.stderr.buffer, prefix, _STDERR_TAIL_LINES)
            self._stdout.append(_Prefixer(stdout, sys.stdout.buffer, prefix))
            self._stderr.append(err)
            self._procs.append(proc)

    def adopt(
        self, result: RendezvousResult, ctx: LaunchContext, base_env: Mapping[str, str]
    ) -> list[dict[str, str]]:
        """Keep these running workers for ``result``'s round (they re-form in place);
        returns each local rank's env for that round, as ``start`` would give it."""
        self._result, self._ctx, self._base_env = result, ctx, base_env
        self._failed.clear()
        envs = [worker_env(self._base_env, result, ctx, i) for i in range(len(self._procs))]
        # The worker's lines from now on are read under its new rank (a line it wrote
        # just before it re-forms may still carry the new one: the agent cannot see
        # the moment the script takes the round).
        for env, out, err in zip(envs, self._stdout, self._stderr, strict=True):
            out.prefix = err.prefix = _prefix(env["RANK"])
        for env in envs:  # where this round's error files go (start does the same)
            Path(env["TORCHELASTIC_ERROR_FILE"]).parent.mkdir(parents=True, exist_ok=True)
        return envs

    def _fork(self, env: Mapping[str, str]) -> tuple[_Proc, IO[bytes], IO[bytes]] | None:
        """A worker from the fork server with its output pipes, or None to spawn normally."""
        if self._forkserver is None or not self._forkserver.alive:
            return None
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            proc = self._forkserver.spawn(env, out_w, err_w)
        except ZygoteGoneError:
            os.close(out_r)
            os.close(err_r)
            return None
        finally:
            os.close(out_w)
            os.close(err_w)
        return proc, os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb")

    def poll(self) -> tuple[GroupState, list[WorkerFailure]]:
        """RUNNING while any worker runs and none failed; FAILED on the first failure."""
        drain_until = time.monotonic() + _STDERR_DRAIN_S  # one wait for all, not each
        failures = []
        running = False
        for local_rank, proc in enumerate(self._procs):
            code = self._ended.get(local_rank, proc.poll())
            if code is None:
                code = self._end_if_hung_in_teardown(local_rank, proc)
            if code is None:
                running = True
            elif code != 0:
                if local_rank not in self._failed:
                    drain = max(0.0, drain_until - time.monotonic())
                    self._failed[local_rank] = self._failure(local_rank, code, drain)
                failures.append(self._failed[local_rank])
        if failures:
            return GroupState.FAILED, failures
        return (GroupState.RUNNING if running else GroupState.SUCCEEDED), []

    def _end_if_hung_in_teardown(self, local_rank: int, proc: _Proc) -> int | None:
        """The script's exit code if this worker hung in teardown (now ended), else None.

        Its script returned ``teardown_grace`` seconds ago or more and the
        process is still there: record its stacks, SIGKILL it, and take the
        code the script ended with (the work is done; only the process would
        not end). Checked on the worker's own file, so never before it returned.
        """
        if local_rank >= len(self._files):
            return None
        finished = read_finished(self._files[local_rank][0])
        if finished is None:
            return None
        code, at = finished
        late = time.time() - at
        if late < self._ctx.teardown_grace:
            return None
        stack = hangs.capture(proc.pid, self._files[local_rank][1])
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5.0)
        rank = self._result.rank_offset + local_rank
        log.warning(
            "round %d: rank %d hung in teardown %.0f s after its script returned %d; "
            "killed it; its stacks:\n%s",
            self._result.round, rank, late, code, stack or "(none could be read)",
        )  # fmt: skip
        self._ended[local_rank] = code
        if self.hang is None:
            self.hang = HangReport(HangKind.TEARDOWN, rank, late, self._result.round, stack)
        return code

    def stacks(self, *, native: bool = True) -> list[tuple[int, str]]:
        """(local rank, captured stacks) of every worker still running (``hangs.capture``)."""
        out = []
        for local_rank, proc in enumerate(self._procs):
            if local_rank in self._ended or proc.poll() is not None:
                continue
            path = self._files[local_rank][1] if local_rank < len(self._files) else None
            out.append((local_rank, hangs.capture(proc.pid, path, native=native)))
        return out

    def pulses(self) -> list[Pulse | None]:
        """Each local worker's pulse (``pulse.read_pulse``); None where it wrote none."""
        return [read_pulse(files[2]) for files in self._files]

    def end_hung(
        self, since: float, stacks: list[tuple[int, str]] | None = None
    ) -> HangReport | None:
        """End every worker still running (a completion hang); None if none ran.

        ``since``: unix time the job completed on another member; ``stacks``:
        what ``stacks()`` captured just before (captured now if None). The
        report is about the lowest rank: ``TEARDOWN`` when every one of them
        was tearing down (``hangs.in_teardown``; their exit counts as 0),
        else ``COMPLETION``.
        """
        stacks = self.stacks() if stacks is None else stacks
        if not stacks:
            return None
        self.signal(signal.SIGKILL)
        self.wait(5.0)
        teardown = all(hangs.in_teardown(stack) for _local, stack in stacks)
        kind = HangKind.TEARDOWN if teardown else HangKind.COMPLETION
        offset = self._result.rank_offset
        for local_rank, stack in stacks:
            log.warning(
                "round %d: rank %d still running %.0f s after the job completed (%s); "
                "killed it; its stacks:\n%s",
                self._result.round, offset + local_rank, time.time() - since, kind.value,
                stack or "(none could be read)",
            )  # fmt: skip
        local_rank, stack = stacks[0]
        self.hang = HangReport(
            kind, offset + local_rank, time.time() - since, self._result.round, stack
        )
        if teardown:
            self._ended.update(dict.fromkeys((local for local, _ in stacks), 0))
        return self.hang

    def _failure(self, local_rank: int, code: int, drain: float) -> WorkerFailure:
        rank = self._result.rank_offset + local_rank
        recorded = rootcause.read_error_file(error_file(self._ctx, self._result.round, rank))
        if recorded is None and local_rank < len(self._stderr):
            tail = self._stderr[local_rank].tail_lines(drain)
            recorded = rootcause.parse_traceback(tail)
            if recorded is not None:  # no time of its own: when we saw the exit
                recorded = dataclasses.replace(recorded, timestamp=time.time())
        if recorded is None:
            return WorkerFailure(rank, code, "")
        cause = recorded.cause(rank, code, self._result.round)
        return WorkerFailure(rank, code, cause.summary(), cause)

    def signal(self, sig: signal.Signals) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)

    def wait(self, timeout: float) -> bool:
        """True if every worker exited within ``timeout``."""
        deadline = time.monotonic() + timeout
        for proc in self._procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return False
        return True

    def stop(self, grace: float) -> None:
        """SIGTERM, up to ``grace`` seconds to exit, then SIGKILL the rest."""
        self.signal(signal.SIGTERM)
        if not self.wait(grace):
            self.signal(signal.SIGKILL)
            self.wait(5.0)
        drain_until = time.monotonic() + _OUTPUT_DRAIN_S  # one wait for all, not each
        copiers = [*self._stdout, *self._stderr]
        for p in copiers:
            p.join(max(0.0, drain_until - time.monotonic()))
        if any(p.alive for p in copiers):
            log.warning(
                "round %d: workers' output still open %.0f s after they stopped "
                "(a process they started holds it); its later lines may follow this round",
                self._result.round,
                _OUTPUT_DRAIN_S,
            )
