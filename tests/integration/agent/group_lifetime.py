"""Prints whether this worker's process group outlives ``destroy_process_group``.

Run as a one-node job: it creates the default gloo group, runs a collective,
drops every reference the script holds, destroys the group and collects; a
weak reference then tells whether the group object (and with it its C++
destructor, where torch's teardown hangs) is still to come. (With a DDP model
torch itself keeps the group until interpreter exit, which a forked worker
never reaches: it ends with ``os._exit``.)
"""

from __future__ import annotations

import datetime
import gc
import sys
import weakref

import torch
import torch.distributed as dist


def main() -> int:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    group = weakref.ref(dist.distributed_c10d._get_default_group())
    dist.all_reduce(torch.ones(4))
    dist.destroy_process_group()
    gc.collect()
    print("group kept until exit" if group() is not None else "group freed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
