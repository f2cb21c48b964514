"""A failed worker's root cause: its exception's type, message and last frames.

Where it sits: ``workers.group.WorkerGroup.poll`` calls ``worker_root_cause`` for
each worker that exited non-zero, and ``first`` picks the one to report, the
earliest by the time the worker recorded it (as torchrun picks the first
failure). The agent puts it in its report (``AgentReport.root_cause``). Pure
parsing plus one bounded file read.

Where a cause comes from, best first:

1. the worker's error file (``env.ERROR_FILE``, which is also torch's
   ``TORCHELASTIC_ERROR_FILE``), in the worker bootstrap's format
   (``workers.zygote.record_exception``: any uncaught exception of a script the fork
   server runs) or in torch's (``@record``: ``{"message": {"message": "Type:
   msg", "extraInfo": {"py_callstack": ..., "timestamp": ...}}}``);
2. the last Python traceback on the worker's stderr (``parse_traceback``):
   scripts spawned without the fork server (``--prewarm off``, a shell
   wrapper) that print one as Python does on an uncaught exception.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from torchflex_contract.progress import MAX_FRAMES, RootCause

_MAX_FILE_BYTES = 256 * 1024
_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+), in (?P<func>.*)$')
_TYPE = re.compile(r"^[A-Za-z_][\w.]*$")
_TRACEBACK = "Traceback (most recent call last):"


@dataclasses.dataclass(frozen=True)
class Recorded:
    """What an error file or a traceback says, before the agent adds rank and round."""

    type: str
    message: str
    frames: tuple[str, ...] = ()
    timestamp: float = 0.0

    def summary(self) -> str:
        """``Type: message``, or whichever of the two is known."""
        return RootCause(self.type, self.message).summary()

    def cause(self, rank: int, exit_code: int, round_no: int) -> RootCause:
        """The contract's bounded ``RootCause`` for worker ``rank``."""
        return RootCause.from_dict(
            {
                "type": self.type,
                "message": self.message,
                "frames": list(self.frames),
                "rank": rank,
                "exit_code": exit_code,
                "round": round_no,
                "timestamp": self.timestamp,
            }
        )


def split_summary(summary: str) -> tuple[str, str]:
    """``"ValueError: boom"`` -> ``("ValueError", "boom")``; no type -> ``("", summary)``."""
    head, sep, rest = summary.partition(": ")
    if sep and _TYPE.match(head):
        return head, rest
    if _TYPE.match(summary.strip()):
        return summary.strip(), ""
    return "", summary


def frame_text(file: str, line: int | str, func: str) -> str:
    return f"{file}:{line} in {func}"


def frames_of(callstack: str) -> tuple[str, ...]:
    """The innermost frames of a formatted traceback, outermost first."""
    frames = [
        frame_text(m["file"], m["line"], m["func"].strip())
        for m in map(_FRAME.match, callstack.splitlines())
        if m is not None
    ]
    return tuple(frames[-MAX_FRAMES:])


def parse_error_file(text: str) -> Recorded | None:
    """An error file in the bootstrap's or torch's format; None if neither."""
    try:
        data: Any = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    try:
        if "type" in data:  # the worker bootstrap's own format
            return Recorded(
                str(data["type"]),
                str(data.get("message", "")),
                tuple(str(f) for f in data.get("frames") or ())[-MAX_FRAMES:],
                float(data.get("timestamp", 0.0)),
            )
        message = data.get("message")
        if isinstance(message, dict):  # torch's @record
            extra = message.get("extraInfo") or {}
            kind, text_ = split_summary(str(message.get("message", "")))
            return Recorded(
                kind,
                text_,
                frames_of(str(extra.get("py_callstack", ""))),
                float(extra.get("timestamp", 0) or 0),
            )
        if message is not None:
            kind, text_ = split_summary(str(message))
            return Recorded(kind, text_, (), float(data.get("timestamp", 0) or 0))
    except (ValueError, TypeError):
        return None
    return None


def read_error_file(path: Path) -> Recorded | None:
    """The error file at ``path``; None if the worker wrote none (or garbage)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_FILE_BYTES)
    except OSError:
        return None
    return parse_error_file(raw.decode("utf-8", "replace"))


def parse_traceback(lines: Sequence[str]) -> Recorded | None:
    """The last Python traceback in ``lines`` (a stderr tail), or None.

    Python prints ``Traceback (most recent call last):``, a ``File ...``
    line (plus source lines) per frame, then ``Type: message``. With chained
    exceptions the last block is the one that ended the process. A message
    spanning lines keeps its first line (the rest may be anything).
    """
    start = max((i for i, line in enumerate(lines) if line.rstrip() == _TRACEBACK), default=-1)
    if start < 0:
        return None
    frames: list[str] = []
    for line in lines[start + 1 :]:
        m = _FRAME.match(line)
        if m is not None:
            frames.append(frame_text(m["file"], m["line"], m["func"].strip()))
            continue
        if line.startswith((" ", "\t")) or not line.strip():
            continue  # a frame's source line, or carets
        kind, message = split_summary(line.rstrip("\n"))
        if kind:
            return Recorded(kind, message, tuple(frames[-MAX_FRAMES:]))
        return None
    return None


def first(causes: Iterable[RootCause]) -> RootCause | None:
    """The earliest cause by recorded time (unknown times last), ties by rank."""
    ordered = sorted(causes, key=lambda c: (c.timestamp <= 0, c.timestamp, c.rank))
    return ordered[0] if ordered else None
