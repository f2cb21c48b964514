"""A gloo job whose rank ``$HANG_RANK`` never ends its process, for real.

``HANG_AT=exit``: the script returns normally, but an ``atexit`` handler then
blocks in libc's ``pause()`` (native code, as a process-group destructor that
waits on its threads does): a teardown hang after the script's work is done.
``HANG_AT=script``: the rank stays in the script's own code after the last
collective (as a final save stuck on a dead filesystem would): a completion hang.
Every other rank exits 0 at once.
"""

from __future__ import annotations

import atexit
import ctypes
import datetime
import os
import sys
import threading

import torch
import torch.distributed as dist


def hang_forever_in_teardown() -> None:
    print("teardown: blocking in pause()", flush=True)
    ctypes.CDLL(None).pause()


def stuck_in_script() -> None:
    print("still in the script after the last step", flush=True)
    threading.Event().wait()


def main() -> int:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    for _ in range(3):
        t = torch.ones(4)
        dist.all_reduce(t)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} trained", flush=True)
    if rank == int(os.environ.get("HANG_RANK", "-1")):
        if os.environ.get("HANG_AT") == "script":
            stuck_in_script()
        atexit.register(hang_forever_in_teardown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
