"""Training progress: a script reports its step, the agent reads it.

Where it sits: imported by training scripts (one call per step) and by the
checkpoint helper (every save, so a script using ``Checkpointer`` reports
without any change); read by the agent (``read_progress``) whenever it builds
its report (``GET /status``, the termination message). Stdlib only, and it
never imports torch. In a script::

    from torchflex_agent.progress import report_step
    report_step(step)                     # after each optimizer step

The contract is a file: the agent names it in every worker's env
(``env.PROGRESS_FILE``); only the worker with ``LOCAL_RANK`` 0 writes it (one
writer per file, and under data parallelism every rank is at the same
step), at most once per ``MIN_WRITE_INTERVAL_S`` plus once at exit, by
atomic replace, so reporting every step costs a clock read. Without that
env (plain ``python``, plain torchrun) every call is a no-op. A script that
reports nothing, and saves no checkpoint with the helper, has no progress in
its agent's report: the status says so instead of guessing.

File format (JSON object)::

    {"step": 1200, "checkpoint_step": 1000, "round": 3, "updated": <unix time>,
     "samples": [[<CLOCK_MONOTONIC s>, <step>], ...]}   # the last few writes

``samples`` lets the agent compute steps per second over the last
``MAX_SAMPLES`` writes (CLOCK_MONOTONIC is the same clock in the worker and
its agent: same machine).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import functools
import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from torchflex_agent import pulse
from torchflex_contract import env as tfenv
from torchflex_contract.progress import Progress

MIN_WRITE_INTERVAL_S = 1.0
MAX_SAMPLES = 8
_MAX_FILE_BYTES = 16 * 1024


class Reporter:
    """Writes one worker's progress file (rate-limited, atomic)."""

    def __init__(
        self,
        path: Path,
        round_no: int = -1,
        *,
        min_interval: float = MIN_WRITE_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self._round = round_no
        self._min_interval = min_interval
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._step = -1
        self._checkpoint = -1
        self._samples: collections.deque[tuple[float, int]] = collections.deque(maxlen=MAX_SAMPLES)
        self._written_at: float | None = None
        self._dirty = False

    def step(self, step: int) -> None:
        """Training reached ``step``; written now unless the last write is too recent."""
        with self._lock:
            self._advance(int(step))
            now = self._clock()
            if self._written_at is None or now - self._written_at >= self._min_interval:
                self._write(now)

    def checkpoint(self, step: int) -> None:
        """A checkpoint of ``step`` was saved (a reached step too); written now."""
        with self._lock:
            self._checkpoint = int(step)
            if step > self._step:
                self._advance(int(step))
            self._write(self._clock())

    def flush(self) -> None:
        """Write what the rate limit held back (at exit)."""
        with self._lock:
            if self._dirty:
                self._write(self._clock())

    def _advance(self, step: int) -> None:
        if step < self._step:
            self._samples.clear()  # went back (a reload): the old rate means nothing
        self._step = step
        self._dirty = True

    def _write(self, now: float) -> None:
        if self._step >= 0 and (not self._samples or self._samples[-1][1] != self._step):
            self._samples.append((now, self._step))
        data = {
            "step": self._step,
            "checkpoint_step": self._checkpoint,
            "round": self._round,
            "updated": self._wall(),
            "samples": [list(s) for s in self._samples],
        }
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(data))
            os.replace(tmp, self.path)
        except OSError:
            # Progress is best-effort: never fail a training step over it.
            with contextlib.suppress(OSError):
                tmp.unlink()
            return
        self._written_at = now
        self._dirty = False


def reporter_for(environ: Mapping[str, str]) -> Reporter | None:
    """The reporter ``environ`` asks for, or None (no agent, or not ``LOCAL_RANK`` 0)."""
    path = environ.get(tfenv.PROGRESS_FILE)
    if not path or environ.get("LOCAL_RANK", "0") != "0":
        return None
    try:
        round_no = int(environ.get(tfenv.ROUND, "-1"))
    except ValueError:
        round_no = -1
    return Reporter(Path(path), round_no)


@functools.cache
def default_reporter() -> Reporter | None:
    """This process's reporter, made on first use from ``os.environ``.

    Never at import: a fork server may import this module before the
    worker's env exists.
    """
    reporter = reporter_for(os.environ)
    if reporter is not None:
        atexit.register(reporter.flush)
    return reporter


def report_step(step: int) -> None:
    """Tell the agent training reached ``step`` (cheap: call it every step)."""
    pulse.tick()
    reporter = default_reporter()
    if reporter is not None:
        reporter.step(step)


def report_checkpoint(step: int) -> None:
    """Tell the agent a checkpoint of ``step`` was saved (``Checkpointer`` calls it)."""
    reporter = default_reporter()
    if reporter is not None:
        reporter.checkpoint(step)


# -- the agent's side ----------------------------------------------------------


def steps_per_second(samples: list[tuple[float, int]]) -> float:
    """Steps per second between the oldest and newest sample; 0 if not measurable."""
    if len(samples) < 2:
        return 0.0
    (t0, s0), (t1, s1) = samples[0], samples[-1]
    if t1 <= t0 or s1 < s0:
        return 0.0
    return round((s1 - s0) / (t1 - t0), 3)


def parse_progress(text: str) -> Progress | None:
    """A progress file's content as the report's ``Progress``; None if malformed."""
    try:
        raw: Any = json.loads(text)
        if not isinstance(raw, dict):
            return None
        samples = [(float(t), int(s)) for t, s in raw.get("samples") or []][-MAX_SAMPLES:]
        return Progress.from_dict({**raw, "steps_per_second": steps_per_second(samples)})
    except (ValueError, TypeError, KeyError):
        return None


def read_progress(path: Path) -> Progress | None:
    """What the file at ``path`` says; None if there is none (nothing reported yet)."""
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_FILE_BYTES)
    except OSError:
        return None
    return parse_progress(data.decode("utf-8", "replace"))
