"""A training script that always raises: the agent must restart it, then give up.

Uses torch's ``record`` so the exception lands in TORCHELASTIC_ERROR_FILE,
the way real training scripts report errors to torchrun.
"""

from __future__ import annotations

import os
import sys

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main() -> int:
    count = os.environ["TORCHELASTIC_RESTART_COUNT"]
    print(f"attempt restart_count={count} rank={os.environ['RANK']}", flush=True)
    raise ValueError(f"deliberate failure in rank {os.environ['RANK']} (boom-7f3a)")


if __name__ == "__main__":
    sys.exit(main())
