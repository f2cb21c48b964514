"""A training script with a bug: it trains a few steps, then rank 0 raises.

Used by the e2e scenario "a user bug": the agent must restart the group up
to ``maxRestarts`` and the job must fail with this message in its status.
Recorded with torch's ``record`` so the error reaches the agent's error file.
"""

from __future__ import annotations

import datetime
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

MARKER = "loss went NaN in layer 3 (bug-5d1e)"


@record
def main() -> int:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "?")
    for step in range(1, 4):
        value = torch.ones(1)
        dist.all_reduce(value)
        print(f"step={step} loss=1.0 world={world} rank={rank} restart={restart}", flush=True)
    if rank == 0:
        raise ValueError(MARKER)
    dist.barrier()  # the others wait for rank 0, which never comes
    return 0


if __name__ == "__main__":
    sys.exit(main())
