"""Training progress read from the pods' logs: parsing (pure) and a live follower.

Where it sits: the e2e scenarios and ``make demo`` assert on and show what
the workers really did, not only on pod phases. The process kubelet keeps
each container's output in ``<state dir>/pods/<ns>_<pod>_<uid>/<container>.log``
(kept after the pod is gone); the agent writes ``round N: ... world size W``
lines and prefixes each worker line with ``[rank R]``; the example script
prints ``step=N loss=X world=W rank=R sps=S``, ``checkpoint step=N`` and
``resumed from step=N``. :class:`LogFollower` tails every log of a namespace
and stamps each line with the time it was seen, so scenarios can order
rounds in time and measure recoveries.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Final

_ROUND: Final = re.compile(r"round (\d+): node rank (\d+) of (\d+), world size (\d+)")
_STEP: Final = re.compile(r"step=(\d+) loss=([-\d.e+naif]+) world=(\d+) rank=(\d+)")
_CKPT: Final = re.compile(r"checkpoint step=(\d+)")
_RESUMED: Final = re.compile(r"resumed from step=(\d+)")
_PREFIX: Final = re.compile(r"^\[rank (\d+)\] ")


@dataclasses.dataclass(frozen=True)
class Line:
    """One parsed log line of interest, with where and when it was seen."""

    seen: float
    """``time.monotonic()`` when the follower read it (0.0 when parsed offline)."""
    pod: str
    kind: str
    """``round``, ``step``, ``checkpoint`` or ``resumed``."""
    round: int
    """The agent round this line belongs to (-1 before the pod's first round)."""
    step: int = -1
    world: int = -1
    rank: int = -1
    loss: float = float("nan")


def pod_of(log_path: Path) -> str:
    """``<ns>_<pod>_<uid>/trainer.log`` -> ``<pod>``."""
    parts = log_path.parent.name.split("_")
    return "_".join(parts[1:-1]) if len(parts) >= 3 else log_path.parent.name


def parse_line(text: str, pod: str, current_round: int, seen: float) -> Line | None:
    """Parse one line; ``current_round`` is the pod's latest ``round`` line."""
    if m := _ROUND.search(text):
        return Line(seen, pod, "round", int(m[1]), world=int(m[4]))
    body = _PREFIX.sub("", text)
    if m := _STEP.search(body):
        try:
            loss = float(m[2])
        except ValueError:
            loss = float("nan")
        return Line(seen, pod, "step", current_round, int(m[1]), int(m[3]), int(m[4]), loss)
    if m := _CKPT.search(body):
        return Line(seen, pod, "checkpoint", current_round, int(m[1]))
    if m := _RESUMED.search(body):
        return Line(seen, pod, "resumed", current_round, int(m[1]))
    return None


def parse_text(text: str, pod: str) -> list[Line]:
    """Every line of interest in one log, offline (``seen`` is 0)."""
    out: list[Line] = []
    current = -1
    for raw in text.splitlines():
        line = parse_line(raw, pod, current, 0.0)
        if line is not None:
            if line.kind == "round":
                current = line.round
            out.append(line)
    return out


@dataclasses.dataclass(frozen=True)
class RoundSpan:
    """What one rendezvous round trained, across every pod."""

    round: int
    worlds: frozenset[int]
    ranks: frozenset[int]
    first_step: int
    last_step: int
    first_seen: float
    last_seen: float


def round_spans(lines: Iterable[Line]) -> list[RoundSpan]:
    """Step lines grouped by round, in round order (rounds without steps left out)."""
    by_round: dict[int, list[Line]] = {}
    for line in lines:
        if line.kind == "step":
            by_round.setdefault(line.round, []).append(line)
    spans = []
    for rnd in sorted(by_round):
        steps = by_round[rnd]
        spans.append(
            RoundSpan(
                round=rnd,
                worlds=frozenset(s.world for s in steps),
                ranks=frozenset(s.rank for s in steps),
                first_step=min(s.step for s in steps),
                last_step=max(s.step for s in steps),
                first_seen=min(s.seen for s in steps),
                last_seen=max(s.seen for s in steps),
            )
        )
    return spans


def progress_violations(lines: list[Line], slack_s: float = 0.5) -> list[str]:
    """What breaks the training invariants the scenarios promise (empty = none).

    - a round trains with one world size, and every rank 0..W-1 reports;
    - rounds never overlap in time: a later round's first step is seen after
      the earlier round's last step (within the follower's ``slack_s``);
    - a round never resumes before the newest checkpoint written before it.
    """
    problems: list[str] = []
    spans = round_spans(lines)
    for span in spans:
        if len(span.worlds) != 1:
            problems.append(f"round {span.round} trained with world sizes {sorted(span.worlds)}")
            continue
        (world,) = span.worlds
        if span.ranks != frozenset(range(world)):
            problems.append(
                f"round {span.round}: ranks {sorted(span.ranks)} for world size {world}"
            )
    for earlier, later in itertools.pairwise(spans):
        if later.first_seen + slack_s < earlier.last_seen:
            problems.append(
                f"round {later.round} trained (from {later.first_seen:.1f}) while round "
                f"{earlier.round} still did (until {earlier.last_seen:.1f})"
            )
        ckpts = [
            ln.step
            for ln in lines
            if ln.kind == "checkpoint" and ln.seen + slack_s < later.first_seen
        ]
        if ckpts and later.first_step - 1 < max(ckpts):
            problems.append(
                f"round {later.round} restarted at step {later.first_step - 1}, "
                f"behind checkpoint step {max(ckpts)}"
            )
    return problems


class FileTail:
    """Complete new lines of growing files since the last read (a line still
    being written is kept until its newline arrives)."""

    def __init__(self) -> None:
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, str] = {}

    def new_lines(self, log: Path) -> list[str]:
        offset = self._offsets.get(log, 0)
        try:
            with log.open("rb") as fh:
                fh.seek(offset)
                chunk = fh.read()
        except OSError:
            return []
        if not chunk:
            return []
        self._offsets[log] = offset + len(chunk)
        text = self._partial.pop(log, "") + chunk.decode(errors="replace")
        complete, _, rest = text.rpartition("\n")
        if rest:
            self._partial[log] = rest
        return complete.splitlines()


class LogFollower:
    """Tails every container log of one namespace in a thread, stamping lines."""

    def __init__(self, pods_dir: Path, namespace: str, poll_s: float = 0.1) -> None:
        self._dir = pods_dir
        self._prefix = f"{namespace}_"
        self._poll_s = poll_s
        self._lock = threading.Lock()
        self._lines: list[Line] = []
        self._tail = FileTail()
        self._round: dict[Path, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="log-follower")

    def __enter__(self) -> LogFollower:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.poll()  # whatever arrived last

    def lines(self, kind: str | None = None) -> list[Line]:
        with self._lock:
            return [ln for ln in self._lines if kind is None or ln.kind == kind]

    def last_step(self) -> int:
        steps = self.lines("step")
        return max((s.step for s in steps), default=0)

    def _run(self) -> None:
        while not self._stop.wait(self._poll_s):
            self.poll()

    def poll(self) -> None:
        now = time.monotonic()
        if not self._dir.is_dir():
            return
        for pod_dir in sorted(self._dir.glob(f"{self._prefix}*")):
            for log in pod_dir.glob("*.log"):
                self._read(log, now)

    def _read(self, log: Path, now: float) -> None:
        complete = self._tail.new_lines(log)
        if not complete:
            return
        pod = pod_of(log)
        parsed = []
        for raw in complete:
            line = parse_line(raw, pod, self._round.get(log, -1), now)
            if line is None:
                continue
            if line.kind == "round":
                self._round[log] = line.round
            parsed.append(line)
        with self._lock:
            self._lines.extend(parsed)
