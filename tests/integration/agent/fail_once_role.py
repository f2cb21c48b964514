"""A worker that needs no torch, for the failure-scope tests: prints its start, and in
the role named by ``--fail-role`` exits 1 after ``--fail-after`` seconds the first
time it runs (a marker file remembers it); otherwise it works for ``--seconds``
(printing a tick each second) and exits 0."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--fail-role", default="")
    p.add_argument("--fail-after", type=float, default=3.0)
    p.add_argument("--marker", type=Path, required=True)
    p.add_argument("--seconds", type=float, default=30.0)
    args = p.parse_args()
    role = os.environ.get("ROLE_NAME", "")
    restarts = os.environ.get("TORCHELASTIC_RESTART_COUNT", "?")
    print(f"start role={role} restarts={restarts} pid={os.getpid()}", flush=True)
    if role == args.fail_role and not args.marker.exists():
        time.sleep(args.fail_after)
        args.marker.write_text("failed once\n")
        print("failing once", flush=True)
        return 1
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        time.sleep(1.0)
        print(f"tick role={role}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
