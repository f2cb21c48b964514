"""A training script that fails with an uncaught exception deep in its own calls.

No ``@record``, no torchflex import: what an unchanged script does. Its
message is far longer than a status may carry, and the stack deeper than
the frames kept, so the report must bound both.
"""

from __future__ import annotations

import os


def level(n: int) -> None:
    if n == 0:
        rank = os.environ.get("RANK")
        raise ValueError(f"bad shard in rank {rank} (root-9c2e) " + "x" * 20000)
    level(n - 1)


def main() -> None:
    print("starting", flush=True)
    level(30)


if __name__ == "__main__":
    main()
