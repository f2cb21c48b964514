"""Ends like many real scripts: a barrier, then rank 0 saves a final model for a while.

The other ranks exit 0 at once; rank 0 sleeps ``FINAL_SAVE_S`` seconds, then
writes ``$FINAL_PATH`` (temp file + rename) and exits 0.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
from pathlib import Path

import torch.distributed as dist


def main() -> int:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        time.sleep(float(os.environ.get("FINAL_SAVE_S", "5")))
        path = Path(os.environ["FINAL_PATH"])
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("model\n")
        os.replace(tmp, path)
        print(f"final model saved to {path}", flush=True)
    else:
        print("done, exiting 0", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
