"""The goodput benchmark's report: its RESULTS.md section, its JSON object and its plot.

Where it sits: ``benchmarks.goodput`` runs the job under chaos and fills one
:class:`Run` per launcher and repetition; this module turns them into the
markdown table (a launcher slot that is not built yet shows as such, never as
a number), the ``--json`` summary and ``benchmarks/plots/goodput.png``. The
arithmetic is ``benchmarks._goodput_stats``'s; nothing here measures.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks import report
from benchmarks._chaos import FREEZE, KILL, REPLACE, ChaosEvent
from benchmarks._goodput_stats import Goodput

NOT_BUILT = "not built yet"
_EVENT_STYLE = {KILL: ("red", "-"), FREEZE: ("blue", "-"), REPLACE: ("grey", ":")}


@dataclasses.dataclass
class Run:
    """One launcher's chaos window in one repetition."""

    launcher: str
    seed: int
    ideal_rate: float | None = None
    result: Goodput | None = None
    curve: list[tuple[float, int]] = dataclasses.field(default_factory=list)
    applied: list[tuple[float, str, int]] = dataclasses.field(default_factory=list)
    """(seconds into the window, action, slot) as each event was actually applied."""
    problems: list[str] = dataclasses.field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        g = self.result
        return {
            "seed": self.seed,
            "ideal_rate": self.ideal_rate,
            "goodput": None if g is None else g.goodput,
            "completed": None if g is None else g.completed,
            "lost": None if g is None else g.lost,
            "progress": None if g is None else g.progress,
            "ideal": None if g is None else g.ideal,
            "restarts": None if g is None else g.restarts,
            "full_s": None if g is None else g.full_s,
            "reduced_s": None if g is None else g.reduced_s,
            "stalled_s": None if g is None else g.stalled_s,
            "applied": self.applied,
            "problems": self.problems,
        }


def _median(runs: Sequence[Run], value: str) -> float | None:
    vals = [getattr(r.result, value) for r in runs if r.result is not None]
    vals = [v for v in vals if v is not None]
    return report.summarize(vals).median if vals else None


def summary(
    launchers: Sequence[str], not_built: Mapping[str, str], runs: Sequence[Run],
    schedules: Mapping[int, Sequence[ChaosEvent]],
) -> dict[str, Any]:  # fmt: skip
    """The ``--json`` object: per launcher its medians and runs; the headline ratios."""
    out: dict[str, Any] = {
        "schedules": {
            str(seed): [dataclasses.asdict(e) for e in events] for seed, events in schedules.items()
        },
        "launchers": {},
    }
    for name in launchers:
        if name in not_built:
            out["launchers"][name] = {"status": NOT_BUILT, "why": not_built[name]}
            continue
        mine = [r for r in runs if r.launcher == name]
        out["launchers"][name] = {
            "status": "measured",
            "goodput": _median(mine, "goodput"),
            "lost": _median(mine, "lost"),
            "reduced_s": _median(mine, "reduced_s"),
            "stalled_s": _median(mine, "stalled_s"),
            "runs": [r.as_json() for r in mine],
        }
    tf = out["launchers"].get("torchflex", {}).get("goodput")
    for ref in ("default", "tuned"):
        other = out["launchers"].get(f"torchrun-{ref}", {}).get("goodput")
        out[f"goodput_ratio_vs_{ref}"] = tf / other if tf and other and other > 0 else None
    return out


def _cell(runs: Sequence[Run], value: str, unit: str, digits: int) -> str:
    vals = [float(getattr(r.result, value)) for r in runs if r.result is not None]
    return report.summarize(vals).fmt(unit, digits).replace("  (", " (") if vals else "n/a"


def _goodput_cell(runs: Sequence[Run]) -> str:
    vals = [r.result.goodput for r in runs if r.result is not None]
    pct = [100 * v for v in vals if v is not None]
    return report.summarize(pct).fmt("%", 0) if pct else "n/a"


def table(launchers: Sequence[str], not_built: Mapping[str, str], runs: Sequence[Run]) -> str:
    header = ["launcher", "goodput (progress / ideal)", "steps completed", "steps lost",
              "progress", "ideal", "restarts", "time at full size", "at reduced size",
              "stalled", "problems"]  # fmt: skip
    rows = []
    for name in launchers:
        if name in not_built:
            rows.append([name, *([NOT_BUILT] * (len(header) - 2)), not_built[name]])
            continue
        mine = [r for r in runs if r.launcher == name]
        problems = sorted({p for r in mine for p in r.problems})
        rows.append([
            name, _goodput_cell(mine), _cell(mine, "completed", "", 0), _cell(mine, "lost", "", 0),
            _cell(mine, "progress", "", 0), _cell(mine, "ideal", "", 0),
            _cell(mine, "restarts", "", 0), _cell(mine, "full_s", "s", 1),
            _cell(mine, "reduced_s", "s", 1), _cell(mine, "stalled_s", "s", 1),
            "; ".join(problems) or "none",
        ])  # fmt: skip
    return report.markdown_table(header, rows)


def schedule_table(schedules: Mapping[int, Sequence[ChaosEvent]]) -> str:
    rows = [
        [str(seed), f"{e.time:.0f} s", e.action, f"node slot {e.node}"]
        for seed, events in schedules.items()
        for e in events
    ]
    return report.markdown_table(["seed", "at", "action", "on"], rows) if rows else "(no events)"


def headline(result: Mapping[str, Any]) -> str:
    def ratio(key: str) -> str:
        value = result.get(key)
        return f"{value:.1f}x" if value else "n/a"

    return (
        f"Goodput of torchflex (unchanged script) vs torchrun: {ratio('goodput_ratio_vs_default')}"
        f" vs defaults, {ratio('goodput_ratio_vs_tuned')} vs tuned."
    )


def plot(runs: Sequence[Run], schedule: Sequence[ChaosEvent], duration: float) -> Path:
    """The job's step over the chaos window, one line per launcher (first repetition)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    shown: set[str] = set()
    for run in runs:
        if run.launcher in shown or not run.curve:
            continue
        shown.add(run.launcher)
        xs = [0.0, *(t for t, _ in run.curve)]
        ys = [run.curve[0][1] - 1, *(s for _, s in run.curve)]
        ax.plot(xs, [y - ys[0] for y in ys], drawstyle="steps-post", label=run.launcher)
    for e in schedule:
        color, line = _EVENT_STYLE[e.action]
        ax.axvline(e.time, color=color, linestyle=line, linewidth=1, alpha=0.6)
    ax.set_xlim(0, duration)
    ax.set_xlabel("seconds into the chaos window (red: kill, blue: freeze, dotted: replacement)")
    ax.set_ylabel("job step (from the window's start)")
    ax.set_title("Training progress under churn (first repetition)")
    ax.legend()
    ax.grid(True, alpha=0.3)
    return report.save_figure(fig, "goodput")
