"""Pure parts of the autoscaler benchmark: one growth's milestones from watch records and the
new pod's log, and the phases between them."""

from __future__ import annotations

import time
from typing import Any

from benchmarks._autoscaler_phases import (
    PHASES,
    Record,
    log_marks,
    object_marks,
    phases,
    since_ready,
)

NOT_READY = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}


def _node(ready: bool | None, taints: list[dict[str, str]]) -> dict[str, Any]:
    conds = [] if ready is None else [{"type": "Ready", "status": str(ready)}]
    return {"metadata": {"name": "tf-spot-1"}, "spec": {"taints": taints},
            "status": {"conditions": conds}}  # fmt: skip


def _pod(node: str | None, phase: str, scheduled: str | None) -> dict[str, Any]:
    conds = [] if scheduled is None else [{"type": "PodScheduled", "status": scheduled}]
    return {"metadata": {"name": "w-1"}, "spec": {"nodeName": node} if node else {},
            "status": {"phase": phase, "conditions": conds}}  # fmt: skip


# A new node as the process kubelet registers it: created with the not-ready
# taint the API server's admission adds, the taint removed, then Ready.
NODE: list[Record] = [
    (10.0, "ADDED", _node(None, [NOT_READY])),
    (10.01, "MODIFIED", _node(None, [])),
    (10.2, "MODIFIED", _node(True, [])),
    (15.2, "MODIFIED", _node(True, [])),
]
POD: list[Record] = [
    (1.0, "ADDED", _pod(None, "Pending", None)),
    (1.05, "MODIFIED", _pod(None, "Pending", "False")),
    (12.0, "MODIFIED", _pod("tf-spot-1", "Pending", "True")),
    (13.0, "MODIFIED", _pod("tf-spot-1", "Running", "True")),
]


def _agent_line(t: float, text: str) -> str:
    ms = round(t * 1000)
    clock = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms // 1000))
    return f"[torchflex-agent] {clock},{ms % 1000:03d} INFO {text}"


def test_object_marks_are_the_first_arrival_of_each_state() -> None:
    marks = object_marks(POD, NODE)
    assert marks == {
        "pending": 1.05,
        "node_created": 10.0,
        "node_ready": 10.2,
        "taint_gone": 10.01,
        "scheduled": 12.0,
        "running": 13.0,
    }


def test_object_marks_of_nothing_seen_are_none() -> None:
    marks = object_marks([], [(9.0, "DELETED", _node(True, []))])
    assert set(marks.values()) == {None}


def test_log_marks_read_the_agent_stamps_and_the_first_step_at_the_world_size() -> None:
    t0 = 1_700_000_000.0
    lines = [
        _agent_line(t0 + 0.5, "connected to the c10d rendezvous store x (startup) after 0.2s"),
        _agent_line(t0 + 2.5, "worker fork server ready (preloaded in 2.00s)"),
        _agent_line(t0 + 2.501, "joining the rendezvous (round >= 0)"),
        _agent_line(t0 + 3.0, "round 1: node rank 1 of 2, world size 2 (rendezvous took 490 ms)"),
        _agent_line(t0 + 3.1, "round 1: started workers (1 forked warm), pids [5]"),
        "[rank 1] resumed from step=40",
        f"[rank 1] step=41 loss=0.1 world=2 rank=1 sps=9.0 t={t0 + 3.4:.3f}",
        f"[rank 1] step=42 loss=0.1 world=2 rank=1 sps=9.0 t={t0 + 3.5:.3f}",
    ]
    got = log_marks(lines, world=2)
    expected = {
        "zygote_ready": 2.5, "joining": 2.501, "round_formed": 3.0, "workers_started": 3.1,
        "world2": 3.4,
    }  # fmt: skip
    assert got.keys() == expected.keys()
    for name, offset in expected.items():
        at = got[name]
        assert at is not None and abs(at - (t0 + offset)) < 1e-3, (name, at)
    assert log_marks(lines, world=3)["world2"] is None


def test_phases_split_the_join_and_add_up() -> None:
    marks: dict[str, float | None] = {
        "pending": 1.0, "requested": 3.0, "node_ready": 10.0, "scheduled": 12.0,
        "running": 13.0, "zygote_ready": 15.5, "workers_started": 16.2, "world2": 16.5,
    }  # fmt: skip
    got = phases(marks)
    assert [name for name, _, _ in PHASES] == list(got)
    assert got["autoscaler"] == 2.0 and got["node start"] == 7.0
    assert got["join"] == 6.5 and got["total"] == 15.5
    split = ("scheduling", "pod start", "agent imports", "rendezvous", "first step")
    parts = [got[name] for name in split]
    assert all(p is not None for p in parts)
    assert abs(sum(p for p in parts if p is not None) - 6.5) < 1e-9


def test_a_missing_milestone_leaves_its_phases_open() -> None:
    got = phases({"pending": 1.0, "requested": 2.0})
    assert got["autoscaler"] == 1.0
    assert got["join"] is None and got["total"] is None


def test_since_ready_is_relative_to_the_node_ready() -> None:
    assert since_ready({"node_ready": 10.0, "scheduled": 12.5, "x": None}) == {
        "node_ready": 0.0, "scheduled": 2.5, "x": None,
    }  # fmt: skip
    assert since_ready({"scheduled": 12.5}) == {"scheduled": None}
