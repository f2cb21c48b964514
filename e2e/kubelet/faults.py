"""Faults the way real nodes produce them, staged on pods of the process kubelet.

Where it sits: the e2e scenarios and the harness integration tests call
these to make a pod go *silent* rather than die: :func:`freeze_pod` stops
every process of the pod's tree with SIGSTOP (a frozen VM, a node under a
kernel hang: sockets stay open, nothing answers), :func:`thaw` lets exactly
those processes go on; :func:`cut_pod_network` takes the pod's port on the
harness bridge down (a pulled cable or a partition: no FIN, no RST, the pod
keeps its address) and :func:`restore_pod_network` brings it back. Pods and
their processes are found through the kubelet's own records
(``records.find``), and every PID is checked against its recorded start time
before it is signalled, so nothing but the pod's processes is ever touched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from pathlib import Path

from e2e.cluster import network
from e2e.kubelet import records
from e2e.kubelet.records import PodRecord, Proc

# Stopping a tree races with forks in flight: a few passes, each one
# stopping what the previous one missed, until a pass finds nothing new.
FREEZE_PASSES = 50
FREEZE_PASS_WAIT_S = 0.02
STOPPED_STATES = ("T", "t")


class FaultError(RuntimeError):
    """The fault could not be staged as asked (nothing to freeze, a tree
    that kept forking, a link that would not change)."""


@dataclasses.dataclass(frozen=True)
class Frozen:
    """The pod and exactly the processes :func:`freeze_pod` stopped."""

    record: PodRecord
    procs: tuple[Proc, ...]
    at: float
    """``time.monotonic()`` when the last process was stopped."""


def _signal(proc: Proc, sig: signal.Signals) -> bool:
    """Signal ``proc`` if that very process still runs; True if it was signalled."""
    if not records.is_alive(proc):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, sig)
        return True
    return False


def freeze_record(record: PodRecord) -> Frozen:
    stopped: dict[int, Proc] = {}
    for _ in range(FREEZE_PASSES):
        fresh = False
        for proc in records.pod_tree(record):
            if proc.pid not in stopped and _signal(proc, signal.SIGSTOP):
                stopped[proc.pid] = proc
                fresh = True
        if not fresh and stopped and all(_stopped(p) for p in stopped.values()):
            return Frozen(record, tuple(stopped.values()), time.monotonic())
        time.sleep(FREEZE_PASS_WAIT_S)
    if not stopped:
        raise FaultError(f"pod {record.namespace}/{record.name} has no live process to freeze")
    raise FaultError(
        f"pod {record.namespace}/{record.name}: the process tree did not settle stopped "
        f"after {FREEZE_PASSES} passes ({len(stopped)} stopped)"
    )


def _stopped(proc: Proc) -> bool:
    st = records.read_stat(proc.pid)
    # A process that died meanwhile is not running either.
    return st is None or st.start != proc.start or st.state in (*STOPPED_STATES, "Z", "X")


def freeze_pod(pods_dir: Path, namespace: str, name: str) -> Frozen:
    """SIGSTOP every process of the pod (its container processes and all below)."""
    return freeze_record(records.find(pods_dir, namespace, name))


def thaw(frozen: Frozen) -> int:
    """SIGCONT the processes :func:`freeze_pod` stopped; returns how many still ran."""
    return sum(1 for proc in frozen.procs if _signal(proc, signal.SIGCONT))


def is_frozen(frozen: Frozen) -> bool:
    """Every stopped process that still exists is still stopped."""
    return all(_stopped(p) for p in frozen.procs)


def cut_pod_network(pods_dir: Path, namespace: str, name: str) -> PodRecord:
    """Take the pod's bridge port down; returns the record to restore it with."""
    record = records.find(pods_dir, namespace, name)
    network.set_pod_link(record.uid, up=False)
    if network.pod_link_up(record.uid):
        raise FaultError(f"the link of {namespace}/{name} ({record.veth}) is still up")
    return record


def restore_pod_network(record: PodRecord) -> None:
    """Bring the port back up if the pod's sandbox still exists."""
    with contextlib.suppress(network.NetworkError):
        network.set_pod_link(record.uid, up=True)
