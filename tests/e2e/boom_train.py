"""A training script whose first step raises ``ValueError("boom")``.

Used by the e2e scenario "the real error in status": no torch, so the pod
starts in a second; the agent records the exception (type, message, frames)
and the job's ``status.lastFailure.rootCause`` must carry it. Arguments (the
example's ``--steps`` ...) are accepted and ignored.
"""

from __future__ import annotations

import sys


def step(n: int) -> float:
    if n == 1:
        raise ValueError("boom")
    return 1.0 / n


def main() -> int:
    for n in range(1, 4):
        print(f"loss={step(n)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
