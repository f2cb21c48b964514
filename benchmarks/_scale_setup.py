"""The "Setup" section of RESULTS.md: cold set-up and cluster start times, recorded once.

Where it sits: not part of ``make bench`` (a cold build takes a quarter of an
hour and must not be rerun as a benchmark). ``python -m
benchmarks._scale_setup LOG`` reads the bash ``time`` output at the end of a
set-up log (a cold virtualenv + toolchain build, as ``.ci/run`` does on a
fresh machine) and writes the ``setup`` section with it, the warm ``.ci/run``
and ``make cluster`` times given as flags, and the earlier breakdown below.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import sys
from pathlib import Path

from benchmarks import report
from benchmarks.cli import command

# Measured earlier on the same 2-core dev machine and recorded in README.md
# (commit history); kept here so the section says where each figure is from.
EARLIER = (
    ("cold toolchain build (`make toolchain`, Go build of every binary)", "10 min 50 s"),
    ("cold virtualenv (`make venv`, torch CPU from the PyPI mirror)", "2 min 36 s"),
)


def parse_time(text: str) -> dict[str, float]:
    """bash ``time`` lines (``real 14m56.683s``) -> seconds, by name; the last of each wins."""
    out: dict[str, float] = {}
    for m in re.finditer(r"^(real|user|sys)\s+(?:(\d+)m)?([\d.]+)s\s*$", text, re.MULTILINE):
        out[m.group(1)] = int(m.group(2) or 0) * 60 + float(m.group(3))
    return out


def _mmss(seconds: float) -> str:
    return f"{int(seconds // 60)} min {seconds % 60:.0f} s"


def body(
    log: Path,
    times: dict[str, float],
    *,
    cluster_up_s: float | None,
    ci_s: float | None,
    ci_tests: int | None,
) -> str:
    when = dt.datetime.fromtimestamp(log.stat().st_mtime, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    rows = [[what, value, "earlier run, cold caches"] for what, value in EARLIER]
    if "real" in times:
        rows.append(
            [
                "cold set-up: virtualenv + toolchain build from empty caches",
                f"{_mmss(times['real'])} wall (user {_mmss(times.get('user', 0))}, "
                f"sys {_mmss(times.get('sys', 0))})",
                f"`time` at the end of `{log.name}`, finished {when}",
            ]
        )
    if ci_s is not None:
        tests = f", {ci_tests} tests" if ci_tests else ""
        rows.append(
            [
                f"`CI=true bash .ci/run` in a fresh clone, warm caches{tests}",
                _mmss(ci_s),
                "`time bash .ci/run`",
            ]
        )
    if cluster_up_s is not None:
        rows.append(
            [
                "`make cluster` (`python -m e2e.cluster up`), warm caches, idle machine",
                f"{cluster_up_s:.0f} s",
                "`time make cluster`",
            ]
        )
    return (
        "Not rerun by `make bench`: one-off measurements of setting the project up. "
        "A cold `.ci/run` is the cold set-up plus the warm run.\n\n"
        + report.markdown_table(["what", "time", "source"], rows)
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks._scale_setup", description=__doc__)
    p.add_argument("log", type=Path, help="set-up log ending with bash `time` output")
    p.add_argument("--cluster-up", type=float, help="seconds a warm `make cluster` took")
    p.add_argument("--ci", type=float, help="seconds a warm `.ci/run` in a fresh clone took")
    p.add_argument("--ci-tests", type=int, help="tests that `.ci/run` passed")
    args = p.parse_args(argv)
    times = parse_time(args.log.read_text(errors="replace"))
    cmd = command("_scale_setup", argv if argv is not None else sys.argv[1:])
    text = body(args.log, times, cluster_up_s=args.cluster_up, ci_s=args.ci, ci_tests=args.ci_tests)
    report.write_section("setup", "Setup", cmd, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
