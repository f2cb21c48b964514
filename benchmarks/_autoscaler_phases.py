"""Pure arithmetic of ``benchmarks.autoscaler``: one growth's milestones and its phases.

Where it sits: the driver records, with the time each arrived, every watch
event of the new Node and of the Pending worker pod (``_autoscaler_trace``),
the test cloud's NodeGroupIncreaseSize call, and reads the new pod's
container log (its agent's stamped lines and the example's ``t=`` step
lines). The functions here turn them into milestones (wall times) and the
phases between them. No I/O, no clocks: unit-tested in
``tests/unit/benchmarks/test_autoscaler_phases.py``.

Milestones, in the order they happen:

* ``pending``: the worker pod first seen with ``PodScheduled=False``;
* ``requested``: the autoscaler's NodeGroupIncreaseSize reached the cloud;
* ``node_created``, ``node_ready``: the Node first seen at all, and with
  ``Ready=True``; ``taint_gone``: first seen without the
  ``node.kubernetes.io/not-ready`` / ``uninitialized`` taints;
* ``scheduled``: the pod first seen with ``spec.nodeName`` (bound);
  ``running``: first seen in phase Running (its kubelet started it);
* ``zygote_ready``, ``joining``, ``round_formed``, ``workers_started``: the
  new pod's agent's own log stamps (``_cluster_logs.JOIN_AGENT_MILESTONES``);
* ``world2``: the first step at the larger world size on the new pod (the
  example's own ``t=`` stamp).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from benchmarks._cluster_logs import JOIN_AGENT_MILESTONES, agent_stamp
from benchmarks._proc_logs import parse_step

Record = tuple[float, str, Mapping[str, Any]]
"""(wall time seen, watch event type, the object as JSON)."""

START_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/uninitialized")
AGENT_MARKS = ("zygote_ready", "joining", "round_formed", "workers_started")
# (phase, from milestone, to milestone): the join (node_ready -> world2) is
# split into the rows after "node start".
PHASES: tuple[tuple[str, str, str], ...] = (
    ("autoscaler", "pending", "requested"),
    ("node start", "requested", "node_ready"),
    ("scheduling", "node_ready", "scheduled"),
    ("pod start", "scheduled", "running"),
    ("agent imports", "running", "zygote_ready"),
    ("rendezvous", "zygote_ready", "workers_started"),
    ("first step", "workers_started", "world2"),
    ("join", "node_ready", "world2"),
    ("total", "pending", "world2"),
)


def _first(records: Iterable[Record], test: Any) -> float | None:
    return next((t for t, kind, obj in records if kind != "DELETED" and test(obj)), None)


def _condition(obj: Mapping[str, Any], kind: str, status: str) -> bool:
    conds = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == status for c in conds)


def _start_tainted(node: Mapping[str, Any]) -> bool:
    taints = (node.get("spec") or {}).get("taints") or []
    return any(t.get("key") in START_TAINTS for t in taints)


def object_marks(pod: Sequence[Record], node: Sequence[Record]) -> dict[str, float | None]:
    """The API objects' milestones: ``pod`` the worker's records, ``node`` the new Node's."""
    return {
        "pending": _first(pod, lambda o: _condition(o, "PodScheduled", "False")),
        "node_created": _first(node, lambda o: True),
        "node_ready": _first(node, lambda o: _condition(o, "Ready", "True")),
        "taint_gone": _first(node, lambda o: not _start_tainted(o)),
        "scheduled": _first(pod, lambda o: bool((o.get("spec") or {}).get("nodeName"))),
        "running": _first(pod, lambda o: (o.get("status") or {}).get("phase") == "Running"),
    }


def log_marks(lines: Iterable[str], world: int) -> dict[str, float | None]:
    """The new pod's own milestones from its container log: its agent's first stamped
    line of each join milestone, and its first step at ``world``."""
    out: dict[str, float | None] = dict.fromkeys((*AGENT_MARKS, "world2"))
    patterns = [(name, pat) for name, pat in JOIN_AGENT_MILESTONES if name in AGENT_MARKS]
    for line in lines:
        at = agent_stamp(line)
        if at is not None:
            for name, pattern in patterns:
                if out[name] is None and pattern.search(line):
                    out[name] = at
            continue
        step = parse_step(line)
        if step is not None and step.world == world and out["world2"] is None:
            out["world2"] = step.t
    return out


def phases(marks: Mapping[str, float | None]) -> dict[str, float | None]:
    """Seconds of each phase of ``PHASES`` (None where a milestone is missing)."""
    out: dict[str, float | None] = {}
    for name, start, end in PHASES:
        a, b = marks.get(start), marks.get(end)
        out[name] = None if a is None or b is None else b - a
    return out


def since_ready(marks: Mapping[str, float | None]) -> dict[str, float | None]:
    """Every milestone as seconds from ``node_ready`` (the trace's table)."""
    ready = marks.get("node_ready")
    return {k: None if v is None or ready is None else v - ready for k, v in marks.items()}
