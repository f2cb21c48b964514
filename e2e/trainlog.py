"""Training progress read from the pods' logs: parsing (pure) and a live follower.

Where it sits: the e2e scenarios and ``make demo`` assert on and show what
the workers really did, not only on pod phases. The process kubelet keeps
each container's output in ``<state dir>/pods/<ns>_<pod>_<uid>/<container>.log``
(kept after the pod is gone); the agent writes ``round N: ... world size W``
lines and prefixes each worker line with ``[rank R]``; the example script
prints ``step=N loss=X world=W rank=R sps=S``, ``checkpoint step=N`` and
``resumed from step=N``. :class:`LogFollower` tails every log of a namespace
and stamps each line with the time it was seen, so scenarios can order
rounds in time and measure recoveries. :class:`CheckpointWatcher` records
every checkpoint that lands on disk (the metadata file
``torchflex_agent.checkpoint`` writes beside ``latest.pt``), so a scenario
can show that no checkpoint ever went backwards.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Final

_ROUND: Final = re.compile(r"round (\d+): node rank (\d+) of (\d+), world size (\d+)")
_STEP: Final = re.compile(r"step=(\d+) loss=([-\d.e+naif]+) world=(\d+) rank=(\d+)")
# "checkpoint step=N refused: ..." (torchflex_agent.checkpoint's warning) is no checkpoint.
_CKPT: Final = re.compile(r"checkpoint step=(\d+)\b(?! refused)")
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
    """``<ns>_<pod>_<uid>/trainer.log`` (the process kubelet) or a real
    kubelet's ``<ns>_<pod>_<uid>/trainer/0.log`` -> ``<pod>``."""
    # Container, pod and namespace names have no "_": the nearest such directory is the pod's.
    for directory in log_path.parents:
        parts = directory.name.split("_")
        if len(parts) >= 3:
            return "_".join(parts[1:-1])
    return log_path.parent.name


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

    def __init__(
        self, pods_dir: Path, namespace: str, poll_s: float = 0.1, *, skip_existing: bool = False
    ) -> None:
        self._dir = pods_dir
        self._prefix = f"{namespace}_"
        # skip_existing: pod directories there before following starts are an earlier run's
        # (a real kubelet removes them at its next garbage collection, up to a minute later).
        self._skip_existing = skip_existing
        self._skipped: set[Path] = set()
        self._poll_s = poll_s
        self._lock = threading.Lock()
        self._lines: list[Line] = []
        self._tail = FileTail()
        self._round: dict[Path, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="log-follower")

    def __enter__(self) -> LogFollower:
        if self._skip_existing and self._dir.is_dir():
            self._skipped = set(self._dir.glob(f"{self._prefix}*"))
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
        for pod_dir in sorted(set(self._dir.glob(f"{self._prefix}*")) - self._skipped):
            # rglob: a real kubelet keeps <container>/<restart>.log under the pod's directory.
            for log in pod_dir.rglob("*.log"):
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


@dataclasses.dataclass(frozen=True)
class Landed:
    """One checkpoint seen on disk."""

    seen: float
    step: int
    round: int
    incarnation: str


def checkpoint_regressions(landed: list[Landed]) -> list[str]:
    """Every checkpoint that replaced one with a higher step (empty = none).

    Training progress is the step: a checkpoint behind one already on disk
    throws work away, whoever wrote it (typically a member the group has
    already replaced, waking up with its old state).
    """
    problems = []
    best: Landed | None = None
    for item in sorted(landed, key=lambda x: x.seen):
        if best is not None and item.step < best.step:
            problems.append(
                f"checkpoint went back from step {best.step} (round {best.round}) to step "
                f"{item.step} (round {item.round}) at {item.seen:.1f}"
            )
        if best is None or item.step >= best.step:
            best = item
    return problems


def checkpoint_line_regressions(lines: list[Line], slack_s: float = 0.5) -> list[str]:
    """``checkpoint step=N`` log lines behind one logged clearly earlier (empty = none)."""
    ckpts = sorted((ln for ln in lines if ln.kind == "checkpoint"), key=lambda ln: ln.seen)
    problems = []
    for line in ckpts:
        earlier = [c.step for c in ckpts if c.seen + slack_s < line.seen]
        if earlier and line.step < max(earlier):
            problems.append(
                f"{line.pod} logged checkpoint step={line.step} after step={max(earlier)} "
                f"had been saved"
            )
    return problems


class CheckpointWatcher:
    """Polls ``<dir>/latest.pt.meta`` in a thread and records each new checkpoint."""

    META = "latest.pt.meta"

    def __init__(self, ckpt_dir: Path, poll_s: float = 0.05) -> None:
        self._path = ckpt_dir / self.META
        self._poll_s = poll_s
        self._lock = threading.Lock()
        self._landed: list[Landed] = []
        self._last: tuple[int, int, int] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="ckpt-watcher")

    def __enter__(self) -> CheckpointWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def landed(self) -> list[Landed]:
        with self._lock:
            return list(self._landed)

    def regressions(self) -> list[str]:
        self.poll()
        return checkpoint_regressions(self.landed())

    def _run(self) -> None:
        while not self._stop.wait(self._poll_s):
            self.poll()

    def poll(self) -> None:
        try:
            st = self._path.stat()
            raw = json.loads(self._path.read_text())
        except (OSError, ValueError):
            return
        # A rename gives a new inode even when size and mtime look the same.
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        with self._lock:
            if key == self._last:
                return
            self._last = key
            self._landed.append(
                Landed(
                    time.monotonic(),
                    int(raw.get("step", -1)),
                    int(raw.get("round", -1)),
                    str(raw.get("incarnation", "")),
                )
            )
