"""A checkpoint helper for training scripts: atomic, ordered, fenced.

Where it sits: imported by training scripts (``examples/train_elastic.py``),
with or without the operator, with or without torchflex's agent (under
plain torchrun there is no fence and rounds are not known: only steps are
ordered). It does not import torch until it saves or loads with the default
serializer. Three lines in a script::

    from torchflex_agent.checkpoint import Checkpointer
    ckpt = Checkpointer(ckpt_dir)                    # once
    state = ckpt.load()                              # newest checkpoint, or None
    ckpt.save(step, {"model": ..., "opt": ...})      # False if refused

A save writes a temp file, fsyncs it, and renames it over ``latest.pt`` (a
reader sees the old or the new file, never half of one), then records
``(incarnation, round, step)`` in ``latest.pt.meta``. Under an exclusive
``flock`` of the directory, right before the rename, it refuses:

* when the fence (``fence.check``) says this process's round is no longer
  current: the member was declared lost, froze past its lease, or its agent
  moved on -- the live group owns the checkpoint now;
* when the checkpoint on disk is newer (``may_replace``): from a higher
  step (training progress is never thrown away, whoever wrote it), or from
  a newer round of the same store incarnation (a member of an older round,
  woken up, never writes over the group that replaced it, even at a
  higher step).

A save that lands is also reported to the agent as training progress
(``progress.report_checkpoint``: the status's last checkpoint step, and the
step itself for a script that reports nothing else).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from torchflex_agent import fence, progress

log = logging.getLogger(__name__)
# Refusals are logged as "save of step N refused: ...", never "checkpoint step=N":
# log readers (e2e.trainlog, the benchmarks) count that phrase as a save.

CKPT_NAME = "latest.pt"
_META_SUFFIX = ".meta"
_LOCK_NAME = ".lock"

SaveFn = Callable[[Any, Path], None]
LoadFn = Callable[[Path], Any]


@dataclasses.dataclass(frozen=True)
class CheckpointMeta:
    step: int
    round: int = -1
    """Rendezvous round that wrote it; -1 without torchflex."""
    incarnation: str = ""
    """The store incarnation ``round`` belongs to (rounds restart on a new store)."""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> CheckpointMeta:
        raw = json.loads(text)
        return cls(int(raw["step"]), int(raw.get("round", -1)), str(raw.get("incarnation", "")))


def may_replace(current: CheckpointMeta | None, new: CheckpointMeta) -> bool:
    """Whether ``new`` may replace ``current`` on disk (pure).

    Never a lower step. Never an older round, where rounds compare: same
    store incarnation, both known (a restarted c10d store numbers rounds
    from 0 again). Equal keys may replace (a final save at the step of a
    periodic one).
    """
    if current is None:
        return True
    if new.step < current.step:
        return False
    same_numbering = (
        bool(current.incarnation)
        and current.incarnation == new.incarnation
        and current.round >= 0
        and new.round >= 0
    )
    return not (same_numbering and new.round < current.round)


def _torch_save(obj: Any, path: Path) -> None:
    import torch  # only when a script saves with the default serializer

    torch.save(obj, path)


def _torch_load(path: Path) -> Any:
    import torch

    return torch.load(path, weights_only=True)


class Checkpointer:
    """Saves and loads ``<directory>/latest.pt`` for one training process."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        save_fn: SaveFn = _torch_save,
        load_fn: LoadFn = _torch_load,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.path = self.directory / CKPT_NAME
        self._save_fn = save_fn
        self._load_fn = load_fn
        self._environ = environ
        # With an explicit env (tests), its own reporter; else the process's.
        self._progress = progress.reporter_for(environ) if environ is not None else None

    @property
    def meta_path(self) -> Path:
        return self.path.with_name(self.path.name + _META_SUFFIX)

    def load(self) -> Any | None:
        """The newest checkpoint's payload (a dict with ``step``), or None if there is none."""
        if not self.path.exists():
            return None
        return self._load_fn(self.path)

    def current_meta(self) -> CheckpointMeta | None:
        """What the checkpoint on disk records; None if there is none."""
        try:
            return CheckpointMeta.from_json(self.meta_path.read_text())
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("unreadable checkpoint metadata %s: %s", self.meta_path, exc)
        if not self.path.exists():
            return None
        # A checkpoint without metadata (written before this helper): its step only.
        payload = self._load_fn(self.path)
        step = payload.get("step", -1) if isinstance(payload, dict) else -1
        return CheckpointMeta(int(step))

    def save(self, step: int, payload: Mapping[str, Any]) -> bool:
        """Write ``payload`` (plus ``step``) atomically; False if refused (see module doc)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / f".{CKPT_NAME}.{os.getpid()}.tmp"
        first = fence.check(self._environ)
        if not first.verdict.may_write:
            log.warning("save of step %d refused: fenced (%s)", step, first.verdict.value)
            return False
        self._save_fn({**payload, "step": step}, tmp)
        try:
            _fsync(tmp)
            with self._locked():
                # Checked again at the commit point: the write may have taken
                # longer than what was left of the lease.
                now = fence.check(self._environ)
                if not now.verdict.may_write:
                    log.warning("save of step %d refused: fenced (%s)", step, now.verdict.value)
                    return False
                new = CheckpointMeta(step, now.round, now.incarnation)
                current = self.current_meta()
                if not may_replace(current, new):
                    log.warning("save of step %d refused: %s on disk is newer", step, current)
                    return False
                os.replace(tmp, self.path)
                _write_atomic(self.meta_path, new.to_json())
                _fsync_dir(self.directory)
        finally:
            tmp.unlink(missing_ok=True)
        if self._environ is None:
            progress.report_checkpoint(step)
        elif self._progress is not None:
            self._progress.checkpoint(step)
        return True

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.directory / _LOCK_NAME, "a+b") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
