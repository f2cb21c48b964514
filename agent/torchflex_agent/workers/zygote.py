"""The warm worker fork server ("zygote"): import torch once, fork a worker per round.

Where it sits: ``prewarm.ForkServer`` (in the agent) starts this module's
source with the *training command's* interpreter, as ``python [opts] -c
<this file> <fd> <target json>``, so it runs stdlib-only and never imports
torchflex. At start it imports what the training script imports at its top
level (found by parsing the script, e.g. ``torch``, ``torch.distributed``):
the 1.5-3 s that a fresh ``python train.py`` spends importing is paid once,
before any round needs a worker. Then it serves spawn requests over a
``SOCK_SEQPACKET`` Unix socket: each request carries the worker's env and
argv plus its stdout/stderr pipe ends (``SCM_RIGHTS``); the zygote forks a
child that becomes the worker (own session, parent-death signal, env and
argv set, then ``runpy`` runs the script as ``__main__``), answers with the
pid, and reports the child's exit status when it reaps it.

Messages (one JSON object per packet):
  agent -> zygote: ``{"op": "spawn", "id": N, "env": {...}, "argv": [...], "cwd": "..."}``
                   with 2 fds (stdout, stderr); argv is ``[script, args...]`` or
                   ``["-m", module, args...]`` (what follows the interpreter options)
  zygote -> agent: ``{"op": "ready"}`` once preloaded; ``{"op": "spawned", "id": N,
                   "pid": P}`` or ``{"op": "failed", "id": N, "message": ...}``;
                   ``{"op": "exit", "pid": P, "code": C}`` (C < 0: killed by signal -C)

A worker ends like a Python process would (exit code, traceback, atexit
handlers, non-daemon threads joined) but skips the interpreter's module
teardown, which costs seconds with torch loaded on a busy machine and sits
on the critical path of every re-formed group, and torch.library's exit
finalizers, which only unregister operators inside the dying process
(``drop_teardown_finalizers``: up to ~100 ms per worker).

An uncaught exception of the script is also recorded (``record_exception``)
in the worker's error file, named by ``TORCHFLEX_ERROR_FILE``
(``torchflex_contract.env.ERROR_FILE``): type, message, the innermost frames
and the time, bounded, so the agent can report the root cause of a failure
without the script doing anything (``rootcause`` reads it).

Two more files let the agent see a worker that finished its work but not its
process (a hang in teardown, e.g. in torch's process-group destructor):
``TORCHFLEX_FINISHED_FILE`` is written the moment the script's code has
returned (its exit code and the time), before the worker's own teardown; and
``faulthandler`` is armed on ``STACK_SIGNAL`` to append every thread's Python
stack to ``TORCHFLEX_STACK_FILE`` when the agent asks (async-signal-safe: it
answers even while the main thread is stuck in C++ holding the GIL).
And a worker keeps every process group the script creates referenced until
it exits (``keep_process_groups``), so no group's destructor, where torch's
teardown hangs, runs in a process that is leaving anyway.
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import ctypes
import faulthandler
import gc
import importlib
import json
import os
import runpy
import select
import signal
import socket
import sys
import threading
import time
import traceback
import weakref
from typing import Any

_PR_SET_PDEATHSIG = 1
# torchflex_contract.env.ERROR_FILE: this file runs stdlib-only, so the name
# is repeated here (a unit test keeps both equal).
ERROR_FILE_ENV = "TORCHFLEX_ERROR_FILE"
# torchflex_contract.env.FINISHED_FILE, .STACK_FILE and .STACK_SIGNAL, likewise.
FINISHED_FILE_ENV = "TORCHFLEX_FINISHED_FILE"
STACK_FILE_ENV = "TORCHFLEX_STACK_FILE"
STACK_SIGNAL = signal.SIGRTMIN + 4
# torchflex_contract.env.PULSE_FILE, likewise.
PULSE_FILE_ENV = "TORCHFLEX_PULSE_FILE"
# torchflex_contract.env.KEPT_GROUPS_ATTR: the list of process groups a worker keeps
# (``keep_process_groups``), an attribute of torch.distributed.distributed_c10d;
# ``torchflex_agent.state`` empties it to free a group it leaves (in-place re-form).
KEPT_GROUPS_ATTR = "torchflex_kept_process_groups"
# What an error file keeps (the contract's RootCause bounds it again).
_ERROR_FRAMES = 8
_ERROR_MESSAGE_CHARS = 4096
_MAX_PACKET = 1 << 20
# Modules torch imports lazily on paths every training script takes: the
# first optimizer construction imports torch._dynamo (and sympy, ~900
# modules, ~1 s). Importing them runs no kernels and starts no threads, so
# forking afterwards stays safe.
_TORCH_LAZY = ("torch._dynamo",)
# Exit-time finalizers (``weakref.finalize``, run by atexit) that only undo
# state inside the process: torch.library keeps one per ``Library`` (~180
# once torch._dynamo is loaded), each removing its operators from the
# dispatcher. A worker ends with ``os._exit`` right after, so, like the
# module teardown it skips, they change nothing outside it; they cost 5-10 ms
# per stopping worker on the dev box (torch 2.13) and 54-118 ms on an idle
# 16-core machine (torch 2.11), on the critical path of every re-form.
# (module, function) pairs.
_TEARDOWN_FINALIZERS = (("torch.library", "_del_library"),)


def preimport_names(source: str) -> list[str]:
    """Absolute modules a script imports at its top level (incl. under ``try``/``if``).

    ``from a.b import c`` yields ``a.b`` and ``a.b.c`` (``c`` may be a
    submodule; importing a name that is not one just fails, harmlessly).
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    names: list[str] = []
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
            names += [f"{node.module}.{alias.name}" for alias in node.names if alias.name != "*"]
        elif isinstance(node, ast.Try):
            todo += node.body
        elif isinstance(node, ast.If):
            todo += node.body + node.orelse
    seen: set[str] = set()
    return [n for n in names if not (n in seen or seen.add(n))]  # type: ignore[func-returns-value]


def _preload(target: dict[str, Any]) -> None:
    """Import installed modules the script uses; never the script's own folder's modules.

    The script's directory and the working directory are kept off
    ``sys.path`` meanwhile: a local module may read RANK & co. at import
    time, which must happen in the worker, with its env, not here.
    """
    names: list[str] = []
    if target.get("kind") == "path":
        try:
            with open(target["target"], encoding="utf-8") as f:
                names = preimport_names(f.read())
        except (OSError, UnicodeDecodeError):
            names = []
    else:
        names = ["torch", "torch.distributed"]
    saved = list(sys.path)
    cwd = os.getcwd()
    local = {"", ".", cwd, os.path.dirname(os.path.abspath(str(target.get("target", ""))))}
    sys.path[:] = [p for p in sys.path if p not in local]
    try:
        for name in names:
            with contextlib.suppress(Exception):
                importlib.import_module(name)
        if "torch" in sys.modules:
            for name in _TORCH_LAZY:
                with contextlib.suppress(Exception):
                    importlib.import_module(name)
    finally:
        sys.path[:] = saved


def _send(sock: socket.socket, msg: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        sock.send(json.dumps(msg).encode())


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def drop_teardown_finalizers(names: tuple[tuple[str, str], ...] = _TEARDOWN_FINALIZERS) -> int:
    """Detach the pending exit finalizers that call one of ``names``; returns how many.

    Only loaded modules count (this never imports one); every other
    finalizer (a script's, tempfile's) still runs at exit.
    """
    funcs = [getattr(sys.modules.get(module), name, None) for module, name in names]
    targets = [f for f in funcs if f is not None]
    if not targets:
        return 0
    # CPython's registry of live finalizers (no public way to list them);
    # without it nothing is dropped and the worker only exits slower.
    registry: dict[Any, Any] = getattr(weakref.finalize, "_registry", {})
    dropped = 0
    for finalizer, info in list(registry.items()):
        if any(getattr(info, "func", None) is f for f in targets):
            finalizer.detach()
            dropped += 1
    return dropped


# Objects a worker keeps referenced until ``os._exit``: the open stack file.
_KEPT: list[Any] = []


def record_finished(code: int, path: str | None) -> None:
    """Write the worker's finished file: the script returned with ``code`` (best-effort)."""
    if not path:
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    with contextlib.suppress(OSError):
        with open(tmp, "w") as f:
            json.dump({"code": code, "timestamp": time.time(), "pid": os.getpid()}, f)
        os.replace(tmp, path)


def arm_stack_dump(path: str | None) -> None:
    """Make ``STACK_SIGNAL`` append every thread's Python stack to ``path`` (best-effort).

    The file stays open for the worker's life: faulthandler writes to its
    descriptor from the signal handler, where nothing may be opened.
    """
    if not path:
        return
    try:
        out = open(path, "a")  # noqa: SIM115 - must outlive this function
        faulthandler.register(STACK_SIGNAL, file=out, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError):
        return
    _KEPT.append(out)


def keep_process_groups() -> None:
    """Hold every process group torch.distributed creates in this worker until it exits.

    A group's C++ destructor joins the backend's threads, and runs wherever
    the last reference drops: in ``destroy_process_group`` or when the
    script's DDP model goes out of scope as ``main`` returns, with the GIL
    held, while a gloo thread may still need the GIL to release a tensor
    (pytorch/pytorch#75097, #179291): the hang users meet at the very end of
    a job. A worker ends with ``os._exit`` (``_finish``), which needs no
    destructor (the kernel closes the group's sockets), so none has to run.
    ``shutdown`` still runs when the script calls ``destroy_process_group``.
    Only when torch.distributed was preloaded; nothing is imported here.
    """
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    register = getattr(c10d, "_register_process_group", None)
    if c10d is None or register is None:
        return
    kept: list[Any] = []

    def keep(group_name: str, pg: Any) -> None:
        kept.append(pg)
        register(group_name, pg)

    setattr(c10d, KEPT_GROUPS_ATTR, kept)
    setattr(c10d, "_register_process_group", keep)  # noqa: B010 - a module global


def arm_pulse(path: str | None) -> bool:
    """Start the worker's pulse (``torchflex_agent.pulse``: steps, forwards, pauses) when
    this interpreter can import it (the agent image's can); True if torch's hooks are set.

    Without it the agent sees no progress from this worker and declares no hang.
    """
    if not path:
        return False
    try:
        pulse = importlib.import_module("torchflex_agent.pulse")
    except ImportError:
        return False
    return bool(pulse.install(path))


def _finish(code: int) -> None:
    """End the worker as Python would, minus the slow module teardown."""
    main = threading.main_thread()
    for t in threading.enumerate():
        if t is not main and not t.daemon:
            with contextlib.suppress(RuntimeError):
                t.join()
    with contextlib.suppress(Exception):
        drop_teardown_finalizers()
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    os._exit(code)


def _script_frames(exc: BaseException) -> list[str]:
    """``file:line in function`` of the innermost frames, the runner's own left out."""
    # Run as ``python -c <source>`` this module's frames say "<string>" (and
    # there is no __file__); imported (tests), they name this file.
    own = {
        "<string>",
        os.path.abspath(globals().get("__file__", "<string>")),
        runpy.__file__,
        "<frozen runpy>",
    }
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in own:
        tb = tb.tb_next
    frames = traceback.extract_tb(tb)[-_ERROR_FRAMES:]
    return [f"{f.filename}:{f.lineno} in {f.name}" for f in frames]


def record_exception(exc: BaseException, path: str | None) -> None:
    """Write the worker's error file for ``exc`` (best-effort, atomic)."""
    if not path:
        return
    try:
        message = str(exc)
    except Exception:  # a broken __str__ must not hide the failure itself
        message = "<unprintable>"
    data = {
        "type": type(exc).__name__,
        "message": message[:_ERROR_MESSAGE_CHARS],
        "frames": _script_frames(exc),
        "timestamp": time.time(),
        "pid": os.getpid(),
    }
    tmp = f"{path}.{os.getpid()}.tmp"
    with contextlib.suppress(OSError):
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)


def _become_worker(req: dict[str, Any], fds: list[int], zygote_pid: int) -> None:
    """In the forked child: detach, wire stdio, set env and argv, run the script; never returns."""
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != zygote_pid:  # the zygote died before prctl took effect
            os._exit(1)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in (devnull, *fds):
            if fd > 2:
                os.close(fd)
        os.environ.clear()
        os.environ.update(req["env"])
        os.chdir(req["cwd"])
        argv = list(req["argv"])
    except BaseException:
        os._exit(127)
    arm_stack_dump(os.environ.get(STACK_FILE_ENV))
    keep_process_groups()
    with contextlib.suppress(Exception):  # never a reason for the script not to run
        arm_pulse(os.environ.get(PULSE_FILE_ENV))
    code = 0
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path.insert(0, os.getcwd())
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException as exc:
        traceback.print_exc()
        if isinstance(exc, Exception):  # as torch's @record: not KeyboardInterrupt & co.
            record_exception(exc, os.environ.get(ERROR_FILE_ENV))
        code = 1
    record_finished(code, os.environ.get(FINISHED_FILE_ENV))
    _finish(code)


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(sock, {"op": "exit", "pid": pid, "code": os.waitstatus_to_exitcode(status)})


def serve(sock: socket.socket) -> None:
    """Answer spawn requests until the agent closes its end (then exit; workers follow)."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    me = os.getpid()
    while True:
        readable, _, _ = select.select([sock.fileno(), wake_r], [], [])
        if wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
        _reap(sock)
        if sock.fileno() not in readable:
            continue
        msg, fds, _flags, _addr = socket.recv_fds(sock, _MAX_PACKET, 4)
        if not msg:
            return
        req = json.loads(msg)
        if req.get("op") != "spawn" or len(fds) != 2:
            for fd in fds:
                os.close(fd)
            _send(sock, {"op": "failed", "id": req.get("id"), "message": "bad request"})
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        # What the preload built (torch, torch._dynamo, sympy: hundreds of thousands of
        # objects) lives as long as the worker: out of the collector's sight, a worker's
        # full collection (the state API's in-place re-form runs one to free its old
        # process group) scans only what the worker built, not the preload (0.4-0.9 s
        # on a loaded 2-core machine before), and never touches these pages (no
        # copy-on-write from the collector). O(1); the zygote's own garbage stays.
        gc.freeze()
        try:
            pid = os.fork()
        except OSError as exc:
            _send(sock, {"op": "failed", "id": req["id"], "message": str(exc)})
        else:
            if pid == 0:
                sock.close()
                os.close(wake_r)
                os.close(wake_w)
                _become_worker(req, fds, me)
            _send(sock, {"op": "spawned", "id": req["id"], "pid": pid})
        for fd in fds:
            os.close(fd)


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    target: dict[str, Any] = json.loads(sys.argv[2])
    _preload(target)
    _send(sock, {"op": "ready"})
    serve(sock)


if __name__ == "__main__":
    main()
