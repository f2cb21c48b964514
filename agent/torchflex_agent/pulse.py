"""Each worker's pulse: is it still training, how fast, and has it said it will pause.

Where it sits: written inside every worker, read by its agent. The fork
server's bootstrap calls ``install`` before it runs the script
(``workers.zygote``), so an *unchanged* script is observed: a global
``torch.optim`` step post-hook counts optimizer steps, and global module
forward hooks time each outermost forward pass (the compute a rank does
alone, before its backward meets the others in all-reduce). Scripts that
report steps (``progress.report_step``, the checkpoint helper, the state
API) tick it too, and ``paused`` is how a script says that the next stretch
makes no steps on purpose (an evaluation on one rank, a long checkpoint)::

    from torchflex_agent.pulse import paused
    with paused("evaluation", max_seconds=1800):
        evaluate(model)

The agent (``loop.stalls``) reads it with ``read_pulse`` every check to
decide whether the job still makes progress (a hang: docs/failure-model.md)
and how long a forward takes on this node against the others (a straggler,
``loop.logic.straggler``).

The contract is a 72-byte record in the file named by ``env.PULSE_FILE``
(one per worker, on the agent's folder), rewritten in place with one
``pwrite`` per event (a few microseconds) and framed by a sequence number at
both ends so that a read racing a write is retried, never misread. Times
are CLOCK_MONOTONIC, the same clock in the worker and its agent. Stdlib only
at import; torch is looked up in ``sys.modules`` (the bootstrap preloaded it),
never imported here. Without ``env.PULSE_FILE`` (plain ``python``, plain
torchrun) everything is a no-op.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import struct
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from torchflex_contract import env as tfenv

# seq, steps, first step, last step, last activity, forward seconds (total), paused until,
# forwards, seq again
_RECORD: Final = struct.Struct("<QQdddddQQ")
RECORD_SIZE: Final = _RECORD.size
_READ_ATTEMPTS: Final = 4
_DDP: Final = "DistributedDataParallel"


@dataclasses.dataclass(frozen=True)
class Pulse:
    """One worker's record as its agent reads it (times on CLOCK_MONOTONIC)."""

    steps: int = 0
    first_step: float = 0.0
    """When the first step ended (0: none yet): with ``last_step``, the mean step time."""
    last_step: float = 0.0
    """When the latest step ended (0: none yet)."""
    last_activity: float = 0.0
    """When it last made progress: a step, an outermost forward, a report (0: none)."""
    forward_total: float = 0.0
    """Seconds spent in outermost forward passes so far (with ``forwards``: the agent's
    mean over any window is the difference of two reads)."""
    paused_until: float = 0.0
    """The script declared a pause (``paused``) that lasts at most until then."""
    forwards: int = 0

    def paused(self, now: float) -> bool:
        """Whether a declared pause holds at ``now`` (it counts as making progress)."""
        return self.paused_until > now


class PulseWriter:
    """The worker's side: the record's fields, written whole after each event."""

    def __init__(self, fd: int, clock: Any = time.monotonic) -> None:
        self._fd = fd
        self._clock = clock
        self._lock = threading.Lock()
        self._seq = 0
        self.steps = 0
        self.first_step = 0.0
        self.last_step = 0.0
        self.last_activity = 0.0
        self.forward_total = 0.0
        self.paused_until = 0.0
        self.forwards = 0
        self._depth = 0
        self._forward_start = 0.0

    def _write(self) -> None:
        self._seq += 1
        data = _RECORD.pack(
            self._seq,
            self.steps,
            self.first_step,
            self.last_step,
            self.last_activity,
            self.forward_total,
            self.paused_until,
            self.forwards,
            self._seq,
        )
        with contextlib.suppress(OSError):
            os.pwrite(self._fd, data, 0)

    def step(self) -> None:
        with self._lock:
            now = self._clock()
            self.steps += 1
            self.first_step = self.first_step or now
            self.last_step = self.last_activity = now
            self._write()

    def touch(self) -> None:
        with self._lock:
            self.last_activity = self._clock()
            self._write()

    def forward_begins(self, module: Any) -> None:
        if type(module).__name__ == _DDP:
            return  # its own forward may wait on peers (buffer broadcast): time the inner one
        if self._depth == 0:
            self._forward_start = self._clock()
        self._depth += 1

    def forward_ends(self, module: Any) -> None:
        if type(module).__name__ == _DDP or self._depth == 0:
            return
        self._depth -= 1
        if self._depth:
            return
        with self._lock:
            now = self._clock()
            self.forward_total += now - self._forward_start
            self.forwards += 1
            self.last_activity = now
            self._write()

    def pause(self, seconds: float) -> None:
        with self._lock:
            now = self._clock()
            self.paused_until = now + seconds
            self.last_activity = now
            self._write()

    def resume(self) -> None:
        with self._lock:
            self.paused_until = 0.0
            self.last_activity = self._clock()
            self._write()


# This worker's writer once ``install`` ran (a list: no ``global`` statement).
_INSTALLED: list[PulseWriter] = []


def install(path: str | None) -> bool:
    """Start this worker's pulse (the bootstrap calls it); True if torch's hooks are set.

    The record is written at once when the hooks are set (the worker is watched
    from its start); without torch loaded, only once the script reports a step
    or declares a pause: a worker that never writes one is never judged. The
    hooks are global: every optimizer and module of the script, with no change.
    """
    if not path:
        return False
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return False
    writer = PulseWriter(fd)
    _INSTALLED[:] = [writer]
    optim = sys.modules.get("torch.optim.optimizer")
    modules = sys.modules.get("torch.nn.modules.module")
    if optim is None or modules is None:
        return False  # no record until a report or a pause: the agent then judges nothing
    writer.touch()
    optim.register_optimizer_step_post_hook(lambda _opt, _args, _kwargs: writer.step())
    modules.register_module_forward_pre_hook(lambda module, _args: writer.forward_begins(module))
    # always_call: a forward that raises must not leave the depth counter up.
    modules.register_module_forward_hook(
        lambda module, _args, _out: writer.forward_ends(module), always_call=True
    )
    return True


def _current() -> PulseWriter | None:
    if not _INSTALLED and os.environ.get(tfenv.PULSE_FILE):
        install(os.environ[tfenv.PULSE_FILE])  # a worker the bootstrap did not start
    return _INSTALLED[0] if _INSTALLED else None


def tick() -> None:
    """Training progressed (``progress.report_step`` calls it): not a hang."""
    writer = _current()
    if writer is not None:
        writer.touch()


@contextlib.contextmanager
def paused(what: str, max_seconds: float = 3600.0) -> Iterator[None]:
    """Declare that the enclosed code makes no training steps on purpose, for at most
    ``max_seconds``: while it runs the job is not hung, on this rank or any other
    (the agents share it through the store). ``what`` names it in the agent's log."""
    if not max_seconds > 0:
        raise ValueError(f"max_seconds must be positive, got {max_seconds!r}")
    writer = _current()
    if writer is None:
        yield
        return
    del what  # the agent logs the pause by its length; the name is for the reader
    writer.pause(float(max_seconds))
    try:
        yield
    finally:
        writer.resume()


# -- the agent's side ----------------------------------------------------------


def read_pulse(path: Path) -> Pulse | None:
    """A worker's record; None if absent, short, or torn by writes every attempt."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        for _ in range(_READ_ATTEMPTS):
            data = os.pread(fd, RECORD_SIZE, 0)
            if len(data) != RECORD_SIZE:
                return None
            seq, steps, first, last, activity, forward, until, forwards, seq2 = _RECORD.unpack(data)
            if seq == seq2:
                return Pulse(steps, first, last, activity, forward, until, forwards)
        return None
    except OSError:
        return None
    finally:
        os.close(fd)
