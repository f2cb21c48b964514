"""Stacks of workers that would not exit, and where they were stuck.

Where it sits: ``workers.group.WorkerGroup`` asks ``capture`` for the stack of a
worker it is about to end because it hung after its script returned (a
teardown hang), and ``loop.supervise`` asks for every running worker's stack
when the job completed on another member and ours ran on past the
completion grace. Two real mechanisms, both read-only for the worker:

- ``faulthandler``, armed by the fork server's bootstrap on
  ``SIGRTMIN + env.STACK_SIGNAL_OFFSET`` (``zygote.arm_stack_dump``): every
  thread's Python frames, written by an async-signal-safe handler, so it
  answers while the main thread is blocked in C++ holding the GIL;
- ``py-spy dump --native`` when it is installed (the agent image has it):
  native frames too (a gloo destructor joining its threads shows as such).
  It reads the worker's memory through ptrace, which Linux allows to the
  worker's ancestor (the agent) under Yama's default scope.

``in_teardown`` is pure: it reads a captured stack.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from torchflex_contract import env as tfenv

log = logging.getLogger(__name__)

STACK_SIGNAL = signal.SIGRTMIN + tfenv.STACK_SIGNAL_OFFSET
# How long a worker's faulthandler gets to write its dump, and py-spy to read one.
_DUMP_WAIT_S = 2.0
_PY_SPY_TIMEOUT_S = 15.0
# A captured stack kept in the agent's log: enough for every thread of a worker.
MAX_CAPTURE = 32_768

# Frames that mark a worker taking its process groups down: the work is done.
_TEARDOWN_FRAMES = (
    "destroy_process_group",
    "~ProcessGroupGloo",
    "~ProcessGroupNCCL",
    "ProcessGroupGloo::~",
    "ProcessGroupNCCL::~",
    "_finish",  # the fork server's bootstrap, after the script returned
)


def in_teardown(stack: str) -> bool:
    """Whether a captured stack shows a worker tearing its process groups down."""
    return any(frame in stack for frame in _TEARDOWN_FRAMES)


def capture(pid: int, stack_file: Path | None, *, native: bool = True) -> str:
    """Every thread's stack of worker ``pid`` (bounded); empty if nothing could read it.

    ``native=False`` skips py-spy (a second or more per worker under load): for a
    declared hang, where every member captures before its workers restart, the
    Python frames name where each rank is and the restart should not wait.
    """
    parts = []
    python = _faulthandler_dump(pid, stack_file)
    if python:
        parts.append(python)
    spied = _py_spy_dump(pid) if native else ""
    if spied:
        parts.append(spied)
    text = "\n".join(parts)
    return text[-MAX_CAPTURE:]


def _faulthandler_dump(pid: int, stack_file: Path | None) -> str:
    """Signal the worker's armed faulthandler and read what it appended.

    The file exists only once the bootstrap armed the handler (the group
    removes it before a worker starts): an unarmed process would die of the
    real-time signal's default action, so it is never signalled.
    """
    if stack_file is None or not stack_file.exists():
        return ""
    try:
        start = stack_file.stat().st_size
        os.kill(pid, STACK_SIGNAL)
    except OSError:
        return ""
    deadline = time.monotonic() + _DUMP_WAIT_S
    size = start
    while time.monotonic() < deadline:
        time.sleep(0.05)
        with contextlib.suppress(OSError):
            now = stack_file.stat().st_size
            if now > start and now == size:  # grown, then stable for one slice
                break
            size = now
    try:
        with stack_file.open("rb") as f:
            f.seek(start)
            return f.read(MAX_CAPTURE).decode("utf-8", "replace")
    except OSError:
        return ""


def _py_spy_dump(pid: int) -> str:
    spy = shutil.which("py-spy")
    if spy is None:
        return ""
    try:
        done = subprocess.run(
            [spy, "dump", "--native", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=_PY_SPY_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.info("py-spy could not read worker %d: %s", pid, exc)
        return ""
    if done.returncode != 0:
        log.info("py-spy could not read worker %d: %s", pid, done.stderr.strip()[-300:])
        return ""
    return done.stdout
