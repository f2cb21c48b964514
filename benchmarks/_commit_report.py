"""The state API's step-time benchmark report: overhead arithmetic, RESULTS.md section, JSON.

Where it sits: ``benchmarks.state_commit`` runs the ranks, once per mode and
round, and fills one :class:`Sample` per (mode, round) with what its ranks
measured; this module turns them into the overhead against the baseline, the
markdown of the RESULTS.md section and the ``--json`` object. Nothing here
measures. A mode that was not run shows as such in the table, never as a
number, and has no overhead; without a baseline no mode has one either.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks import report

BASELINE = "baseline"
REPLICATED = "replicated"
SHARDED = "sharded"
MODES: tuple[str, ...] = (BASELINE, REPLICATED, SHARDED)
_LABEL = {BASELINE: "no state API", REPLICATED: "replicated", SHARDED: "sharded=True"}
TARGET_PCT = 5.0
NOT_RUN = "not run"


@dataclasses.dataclass
class Sample:
    """What every rank of one mode's run in one round measured (seconds)."""

    mode: str
    round: int
    steps: list[float] = dataclasses.field(default_factory=list)
    """The whole step's wall time, every rank and measured step."""
    commits: list[float] = dataclasses.field(default_factory=list)
    landed: list[float] = dataclasses.field(default_factory=list)
    """sharded: from ``commit`` beginning to the copy in the successor's folder."""
    probes: int = 0
    """sharded: how many copies were looked for (``landed`` has those seen within the step)."""


def overhead_pct(mode_median: float | None, base_median: float | None) -> float | None:
    """(mode - baseline) / baseline in %; None without both or with a baseline <= 0."""
    if mode_median is None or base_median is None or base_median <= 0:
        return None
    return 100.0 * (mode_median - base_median) / base_median


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _p90(values: Sequence[float]) -> float | None:
    return report.percentile(values, 90) if values else None


def _pooled(samples: Sequence[Sample], field: str) -> list[float]:
    return [v for s in samples for v in getattr(s, field)]


def _round_overheads(samples: Sequence[Sample], mode: str) -> list[float]:
    """The overhead of ``mode`` in each round that ran both it and the baseline."""
    out = []
    for rnd in sorted({s.round for s in samples if s.mode == mode}):
        base = _median(
            _pooled([s for s in samples if (s.mode, s.round) == (BASELINE, rnd)], "steps")
        )
        mine = _median(_pooled([s for s in samples if (s.mode, s.round) == (mode, rnd)], "steps"))
        pct = overhead_pct(mine, base)
        if pct is not None:
            out.append(pct)
    return out


def summary(samples: Sequence[Sample], *, ranks: int, step_time: float) -> dict[str, Any]:
    """The ``--json`` object: per mode its medians (seconds) and overhead (%), or ``not run``."""
    base = _median(_pooled([s for s in samples if s.mode == BASELINE], "steps"))
    modes: dict[str, Any] = {}
    for mode in MODES:
        mine = [s for s in samples if s.mode == mode]
        if not mine:
            modes[mode] = {"status": NOT_RUN}
            continue
        steps = _pooled(mine, "steps")
        commits = _pooled(mine, "commits")
        landed = _pooled(mine, "landed")
        entry: dict[str, Any] = {
            "status": "measured",
            "rounds": len(mine),
            "steps": len(steps),
            "step_median_s": _median(steps),
            "step_p90_s": _p90(steps),
            "overhead_pct": None if mode == BASELINE else overhead_pct(_median(steps), base),
            "overhead_pct_per_round": [] if mode == BASELINE else _round_overheads(samples, mode),
            "commit_median_s": _median(commits),
            "commit_p90_s": _p90(commits),
        }
        if mode == SHARDED:
            entry["copy_landed_median_s"] = _median(landed)
            entry["copy_landed_p90_s"] = _p90(landed)
            entry["copies_seen"] = len(landed)
            entry["copies_probed"] = sum(s.probes for s in mine)
        modes[mode] = entry
    worst = [m["overhead_pct"] for m in modes.values() if m.get("overhead_pct") is not None]
    return {
        "ranks": ranks,
        "step_time_s": step_time,
        "target_pct": TARGET_PCT,
        "modes": modes,
        "within_target": max(worst) <= TARGET_PCT if worst else None,
    }


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1e3:.2f} ms"


def _pct(entry: Mapping[str, Any]) -> str:
    pct = entry["overhead_pct"]
    if pct is None:
        return "n/a"
    rounds = entry["overhead_pct_per_round"]
    spread = f" (rounds {min(rounds):+.1f} to {max(rounds):+.1f} %)" if len(rounds) > 1 else ""
    return f"{pct:+.1f} %{spread}"


def table(result: Mapping[str, Any]) -> str:
    header = ["mode", "step median", "step p90", "overhead vs no state API", "commit median",
              "commit p90", "copy at the successor (median, p90)", "steps measured"]  # fmt: skip
    rows = []
    for mode in MODES:
        entry = result["modes"][mode]
        if entry["status"] == NOT_RUN:
            rows.append([_LABEL[mode], *([NOT_RUN] * (len(header) - 1))])
            continue
        baseline = mode == BASELINE
        copy = "-"
        if mode == SHARDED:
            copy = (
                f"{_ms(entry['copy_landed_median_s'])}, {_ms(entry['copy_landed_p90_s'])} "
                f"({entry['copies_seen']} of {entry['copies_probed']} seen within the step)"
            )
        rows.append([
            _LABEL[mode], _ms(entry["step_median_s"]), _ms(entry["step_p90_s"]),
            "(the reference)" if baseline else _pct(entry),
            "-" if baseline else _ms(entry["commit_median_s"]),
            "-" if baseline else _ms(entry["commit_p90_s"]), copy, str(entry["steps"]),
        ])  # fmt: skip
    return report.markdown_table(header, rows)


def verdict(result: Mapping[str, Any]) -> str:
    ok = result["within_target"]
    if ok is None:
        return f"Target: step-time overhead <= {TARGET_PCT:.0f} % (issue 18): not measured here."
    return (
        f"Target: step-time overhead <= {TARGET_PCT:.0f} % (issue 18): "
        f"{'met' if ok else 'NOT met'} by every mode measured."
    )


def what_is_measured(*, ranks: int, step_time: float, rounds: int, probe_every: int) -> str:
    return (
        f"What is measured: {ranks} gloo ranks on loopback (one process each, own state "
        f"folder in `/dev/shm`, one lease file, as under `torchflex-agent`) train the example "
        f"model of `examples/train_stateful.py` (16-32-1 MLP, SGD with momentum). A step is a "
        f"forward/backward and optimizer step, an all-reduce (the step's sync), `commit(step)` "
        f"in the modes that have one, and the example's work stand-in as a fixed "
        f"`time.sleep({step_time:g})` (not a sleep to a deadline, so any time the state API "
        f"adds, the receiver thread's CPU and GIL time included, shows in the step). The step "
        f"time is each rank's wall time for the whole step, over every rank and step after "
        f"the warm-up; the overhead is the mode's median step over the baseline's (the same "
        f"ranks and loop with no `TrainState` at all) minus one. The modes run one after "
        f"another in {rounds} round(s), the order rotated each round, so slow spells of a "
        f"shared machine fall on every mode; the spread across rounds is shown beside the "
        f"pooled figure. `sharded=True` looks for its copy in the successor's folder on every "
        f"{probe_every}th step only (polling its header after `commit`); in every mode those "
        f"steps and the ones after them are left out of the step times."
    )


def markdown(
    result: Mapping[str, Any], *, rounds: int, probe_every: int, load: str
) -> str:  # fmt: skip
    """The RESULTS.md section's body."""
    ranks, step_time = result["ranks"], result["step_time_s"]
    return "\n\n".join([
        verdict(result),
        table(result),
        what_is_measured(ranks=ranks, step_time=step_time, rounds=rounds, probe_every=probe_every),
        load,
    ])  # fmt: skip
