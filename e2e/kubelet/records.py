"""What the process kubelet records about each pod it runs, and reading it back.

Where it sits: ``agent`` writes ``<pod dir>/runtime.json``
(``runtime.write_record``) whenever a pod's sandbox or a container changes
(network namespace, bridge port, address, and each container's main PID
with its kernel start time). ``faults`` and the
tests read it to act on exactly the processes the kubelet started, never on
processes found by a name pattern. The parsing of ``/proc`` and the process
tree walk are pure functions over text and maps, unit-tested on their own.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

RECORD_NAME = "runtime.json"


@dataclasses.dataclass(frozen=True)
class Proc:
    """A process identity that survives PID reuse: PID plus kernel start time."""

    pid: int
    start: int


@dataclasses.dataclass(frozen=True)
class PodRecord:
    uid: str
    namespace: str
    name: str
    netns: str
    veth: str
    ip: str
    containers: dict[str, Proc]

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["containers"] = {k: dataclasses.asdict(v) for k, v in self.containers.items()}
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PodRecord:
        containers = {
            str(k): Proc(int(v["pid"]), int(v["start"])) for k, v in data["containers"].items()
        }
        return cls(
            uid=str(data["uid"]),
            namespace=str(data["namespace"]),
            name=str(data["name"]),
            netns=str(data["netns"]),
            veth=str(data["veth"]),
            ip=str(data["ip"]),
            containers=containers,
        )


@dataclasses.dataclass(frozen=True)
class Stat:
    """The fields of ``/proc/<pid>/stat`` the harness needs."""

    pid: int
    state: str
    ppid: int
    start: int


def parse_stat(text: str) -> Stat:
    """Parse ``/proc/<pid>/stat``; the command name may hold spaces and parens."""
    head, _, rest = text.rpartition(")")
    pid = int(head.split("(", 1)[0])
    fields = rest.split()
    # After "pid (comm)": state is field 3, ppid 4, starttime 22 (1-based).
    return Stat(pid=pid, state=fields[0], ppid=int(fields[1]), start=int(fields[19]))


def descendants(parents: Mapping[int, int], roots: Iterable[int]) -> list[int]:
    """``roots`` and every process below them, parents before children."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    out: list[int] = []
    seen: set[int] = set()
    todo = [r for r in roots if r in parents]
    while todo:
        pid = todo.pop(0)
        if pid in seen:
            continue
        seen.add(pid)
        out.append(pid)
        todo.extend(sorted(children.get(pid, [])))
    return out


def write(pod_dir: Path, record: PodRecord) -> None:
    path = pod_dir / RECORD_NAME
    tmp = pod_dir / f".{RECORD_NAME}.tmp"
    tmp.write_text(json.dumps(record.to_json(), indent=1))
    tmp.replace(path)


def read(pod_dir: Path) -> PodRecord | None:
    try:
        return PodRecord.from_json(json.loads((pod_dir / RECORD_NAME).read_text()))
    except (OSError, ValueError, KeyError):
        return None


def find(pods_dir: Path, namespace: str, name: str) -> PodRecord:
    """The record of the live pod ``namespace/name`` (the newest one by that name).

    Raises ``LookupError`` when the kubelet runs no such pod.
    """
    found = []
    for pod_dir in pods_dir.glob(f"{namespace}_{name}_*"):
        rec = read(pod_dir)
        if rec is not None and rec.namespace == namespace and rec.name == name:
            found.append((pod_dir.stat().st_mtime, rec))
    if not found:
        raise LookupError(f"the process kubelet records no pod {namespace}/{name}")
    return max(found, key=lambda item: item[0])[1]


def read_stat(pid: int) -> Stat | None:
    try:
        return parse_stat(Path(f"/proc/{pid}/stat").read_text())
    except (OSError, ValueError, IndexError):
        return None


def proc_of(pid: int) -> Proc | None:
    st = read_stat(pid)
    return None if st is None else Proc(pid, st.start)


def is_alive(proc: Proc) -> bool:
    """The same process still runs (and is not a zombie) under that PID."""
    st = read_stat(proc.pid)
    return st is not None and st.start == proc.start and st.state not in ("Z", "X")


def all_stats() -> dict[int, Stat]:
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = read_stat(int(entry.name))
            if st is not None:
                out[st.pid] = st
    return out


def process_tree(pid: int) -> list[int]:
    """``pid`` and every live process below it, parents before children
    (for the tests and benchmarks that freeze or kill a process they started)."""
    parents = {p: st.ppid for p, st in all_stats().items()}
    return descendants(parents, [pid])


def pod_tree(record: PodRecord) -> list[Proc]:
    """Every live process of the pod: each recorded container process that
    still runs as recorded, and everything below it."""
    stats = all_stats()
    roots = [
        p.pid
        for p in record.containers.values()
        if p.pid in stats and stats[p.pid].start == p.start
    ]
    parents = {pid: st.ppid for pid, st in stats.items()}
    return [Proc(pid, stats[pid].start) for pid in descendants(parents, roots)]
