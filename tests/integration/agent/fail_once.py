"""A worker that fails on the job's first attempt and runs on later ones.

``TORCHELASTIC_RESTART_COUNT`` is the job-wide count: 0 means first attempt
(exit 1, so the agents count one restart); from then on it prints the count
every 0.2 s until SIGTERM. A count that fell back to 0 makes it fail again.
"""

from __future__ import annotations

import os
import signal
import sys
import time


def main() -> int:
    count = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if count == 0:
        print(f"failing restart_count={count}", flush=True)
        return 1
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    while True:
        print(f"running restart_count={count}", flush=True)
        time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main())
