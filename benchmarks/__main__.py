"""``make bench`` / ``python -m benchmarks``: runs every benchmark, one after another.

Where it sits: the entry point over ``benchmarks/<name>.py``; each of those
also runs alone (``python -m benchmarks.<name>``), takes the common flags of
:mod:`benchmarks.cli` (``--quick``, ``--json``, ``--reps``, ``--no-write``) and
writes its own section of ``benchmarks/RESULTS.md`` through
:mod:`benchmarks.report`. Benchmarks run
in sequence, never in parallel, so one does not disturb another's timings.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

# In the order ``make bench`` runs them: process-level ones first (no
# cluster), then the ones that need the local control plane.
BENCHMARKS: tuple[str, ...] = (
    "rendezvous",
    "recovery",
    "preemption",
    "goodput",
    "state_commit",
    "hang",
    "recovery_cluster",
    "straggler",
    "operator_scale",
    "autoscaler",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Run the torchflex benchmarks and update benchmarks/RESULTS.md.",
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=BENCHMARKS,
        help="run only this benchmark (repeatable); default: all",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer repetitions and sizes (a smoke run; numbers are not for RESULTS.md)",
    )
    args = parser.parse_args(argv)
    chosen = args.only or list(BENCHMARKS)
    failed: list[str] = []
    for name in chosen:
        cmd = [sys.executable, "-m", f"benchmarks.{name}"]
        if args.quick:
            cmd.append("--quick")
        print(f"[bench] {' '.join(cmd[1:])}", flush=True)
        t0 = time.monotonic()
        rc = subprocess.run(cmd, check=False).returncode
        print(f"[bench] {name}: exit {rc} after {time.monotonic() - t0:.0f} s", flush=True)
        if rc != 0:
            failed.append(name)
    if failed:
        print(f"[bench] failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
