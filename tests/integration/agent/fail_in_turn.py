"""A worker that fails on its agent's turn and runs otherwise: failures alternate between nodes.

``FAIL_TURN`` (0 or 1, set per agent) picks the attempts it fails on:
``TORCHELASTIC_RESTART_COUNT % 2 == FAIL_TURN``. On the other attempts it
prints the count every 0.2 s until SIGTERM (a peer's failure ends the round).
With two agents, each failure is a different node's: a per-agent budget would
allow twice as many as a job-wide one.
"""

from __future__ import annotations

import os
import signal
import sys
import time


def main() -> int:
    count = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if count % 2 == int(os.environ["FAIL_TURN"]):
        print(f"failing restart_count={count}", flush=True)
        return 1
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    while True:
        print(f"running restart_count={count}", flush=True)
        time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main())
