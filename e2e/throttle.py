"""A node made slow: CPU quota on a process tree, as a kubelet's CPU limit does.

Where it sits: the straggler scenarios (``tests/integration/agent/test_agent_stalls.py``,
``tests/e2e/test_stalls.py``) put one pod's processes under a CPU quota with
``throttled``: a cgroup (v1 ``cpu`` controller) of the harness's own, created
for the test and removed after it, with ``cpu.cfs_quota_us`` a fraction of
``cpu.cfs_period_us``, exactly the CFS bandwidth control a container's CPU
limit uses. Processes the tree forks later (restarted workers) inherit it.
Only the listed processes (started by the test) are moved, and they are moved
back to the root group before the group is removed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

CPU_ROOT = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 100_000
REMOVE_TIMEOUT_S = 10.0


class ThrottleUnavailableError(RuntimeError):
    """This machine has no writable cgroup v1 ``cpu`` controller."""


def available() -> str | None:
    """Why throttling cannot run here, or None when it can."""
    if not (CPU_ROOT / "cpu.cfs_quota_us").exists():
        return f"no cgroup v1 cpu controller at {CPU_ROOT}"
    if not os.access(CPU_ROOT, os.W_OK):
        return f"{CPU_ROOT} is not writable"
    return None


@contextlib.contextmanager
def throttled(pids: Sequence[int], cpus: float) -> Iterator[Path]:
    """Run ``pids`` (and what they fork from now on) on at most ``cpus`` CPUs."""
    why = available()
    if why is not None:
        raise ThrottleUnavailableError(why)
    group = CPU_ROOT / f"torchflex-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(max(1000, int(PERIOD_US * cpus))))
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, OSError):
                (group / "cgroup.procs").write_text(str(pid))
        yield group
    finally:
        _remove(group)


def _remove(group: Path) -> None:
    """Move what is left back to the root group, then remove ours; a process that was
    forking or exiting meanwhile is retried (bounded: 10 s)."""
    deadline = time.monotonic() + REMOVE_TIMEOUT_S
    while True:
        for line in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError, OSError):
                (CPU_ROOT / "cgroup.procs").write_text(line)
        try:
            group.rmdir()
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
        time.sleep(0.1)
