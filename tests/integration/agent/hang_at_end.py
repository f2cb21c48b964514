"""A gloo job whose rank ``$HANG_RANK`` never ends its process, for real.

``HANG_AT=exit``: the script returns normally, but an ``atexit`` handler then
blocks in libc's ``pause()`` (native code, as a process-group destructor that
waits on its threads does): a teardown hang after the script's work is done.
``HANG_AT=script``: the rank stays in the script's own code after the last
collective (as a final save stuck on a dead filesystem would): a completion hang.
``HANG_AT=destroy``: the rank blocks inside a ``destroy_process_group`` frame
that never returns (torch's own destroys the group, then ``pause()``): the
teardown hang of pytorch/pytorch#75097 before the script returns.
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


def destroy_process_group() -> None:
    """torch's, then a block: a stack with this frame is a worker tearing down."""
    dist.destroy_process_group()
    print("destroy_process_group: blocking in pause()", flush=True)
    ctypes.CDLL(None).pause()


def main() -> int:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    for _ in range(3):
        t = torch.ones(4)
        dist.all_reduce(t)
    dist.barrier()
    print(f"rank {rank} trained", flush=True)
    hang_at = os.environ.get("HANG_AT") if rank == int(os.environ.get("HANG_RANK", "-1")) else None
    if hang_at == "destroy":
        destroy_process_group()
    dist.destroy_process_group()
    if hang_at == "script":
        stuck_in_script()
    elif hang_at == "exit":
        atexit.register(hang_forever_in_teardown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
