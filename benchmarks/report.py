"""Shared by every benchmark: statistics, machine facts, and RESULTS.md sections.

Where it sits: each benchmark module (``benchmarks/<name>.py``) measures, then
calls :func:`write_section` with its own name (through :mod:`benchmarks.cli`,
which adds the command and skips smoke runs); this module owns the layout of
``benchmarks/RESULTS.md`` so benchmarks run alone or through ``make bench``
rewrite only their own section and leave the others as they were. Plots go
to ``benchmarks/plots/<name>.png`` through :func:`save_figure`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib.metadata
import os
import platform
import re
import statistics
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from matplotlib.figure import Figure

BENCH_DIR: Final = Path(__file__).resolve().parent
RESULTS_MD: Final = BENCH_DIR / "RESULTS.md"
PLOTS_DIR: Final = BENCH_DIR / "plots"

_HEADER: Final = """# Benchmark results

Measurements, not tests: each section below was written by one benchmark,
with the machine it ran on and the exact command that reproduces it. `make
bench` reruns them all; each also runs alone. Figures are medians over the
repetitions shown, with the spread (min-max) beside them.
"""


@dataclasses.dataclass(frozen=True)
class Summary:
    """Median and spread of repeated measurements of one quantity."""

    n: int
    median: float
    low: float
    high: float

    def fmt(self, unit: str = "s", digits: int = 2) -> str:
        if self.n == 0:
            return "n/a"
        return (
            f"{self.median:.{digits}f} {unit} "
            f"({self.low:.{digits}f}-{self.high:.{digits}f}, n={self.n})"
        )


def summarize(values: Sequence[float]) -> Summary:
    if not values:
        return Summary(0, float("nan"), float("nan"), float("nan"))
    return Summary(len(values), statistics.median(values), min(values), max(values))


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sequence."""
    if not values:
        raise ValueError("percentile of an empty sequence")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_gib() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return f"{int(line.split()[1]) / 2**20:.0f} GiB"
    except OSError:
        pass
    return "unknown"


def _git_rev() -> str:
    out = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=BENCH_DIR,
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() or "unknown"


IDLE_NOTE: Final = "The machine was otherwise idle when the run started."


def shared_before(load_1min: float) -> bool:
    """Whether other work shared the machine, judged on the 1-minute load average taken
    before the run (a run's own processes raise the one after it)."""
    return load_1min > 0.5 * (os.cpu_count() or 1)


def load_note(before: float, after: float) -> str:
    """The machine's 1-minute load average around the run, and what it means here."""
    cores = os.cpu_count() or 1
    return (
        f"1-minute load average {before:.1f} before the run and {after:.1f} after "
        f"({cores} cores). "
        + (
            "Other work shared the machine while this ran: figures taken on a loaded machine."
            if shared_before(before)
            else IDLE_NOTE
        )
    )


def machine_line() -> str:
    """One line naming the machine and the versions that matter."""
    return (
        f"{_cpu_model()}, {os.cpu_count()} cores, {_mem_gib()}, "
        f"Linux {platform.release()}, Python {platform.python_version()}, "
        f"torch {_version('torch')}, torchflex {_git_rev()}"
    )


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- bench:{name}:begin -->", f"<!-- bench:{name}:end -->"


def write_section(name: str, title: str, command: str, body: str) -> Path:
    """Replace (or append) the section ``name`` of RESULTS.md; returns the path."""
    if not re.fullmatch(r"[a-z0-9_-]+", name):
        raise ValueError(f"section name must be [a-z0-9_-]+, got {name!r}")
    begin, end = _markers(name)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    section = (
        f"{begin}\n## {title}\n\n"
        f"Command: `{command}`  \n"
        f"Machine: {machine_line()}  \n"
        f"Run: {stamp}\n\n"
        f"{body.strip()}\n{end}"
    )
    text = RESULTS_MD.read_text() if RESULTS_MD.exists() else _HEADER
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _m: section, text)
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    RESULTS_MD.write_text(text if text.endswith("\n") else text + "\n")
    return RESULTS_MD


def phases_line(phases: Mapping[str, float | None]) -> str:
    """``name 1.23, other n/a, ...``: a run's milestones in seconds, as the drivers print them."""
    return ", ".join(f"{k} {'n/a' if v is None else f'{v:.2f}'}" for k, v in phases.items())


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def save_figure(fig: Figure, name: str, dpi: int = 110) -> Path:
    """Lay out ``fig``, write it as ``plots/<name>.png`` and close it; returns the path."""
    import matplotlib.pyplot as plt

    PLOTS_DIR.mkdir(exist_ok=True)
    path = PLOTS_DIR / f"{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
