"""Pure builders of the pod status the process kubelet reports.

Where it sits: ``agent`` keeps a :class:`ContainerRecord` per container and
turns the pod's records into a status patch with :func:`pod_status`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclasses.dataclass
class ContainerRecord:
    name: str
    image: str
    started_at: str | None = None
    finished_at: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    message: str = ""
    restart_count: int = 0
    last_terminated: dict[str, Any] | None = None
    waiting_reason: str = "ContainerCreating"
    waiting_message: str = ""
    reason: str | None = None
    """Why it terminated, when not simply ``Completed``/``Error``."""

    @property
    def running(self) -> bool:
        return self.started_at is not None and self.exit_code is None

    def terminated_state(self) -> dict[str, Any]:
        assert self.exit_code is not None
        state: dict[str, Any] = {
            "exitCode": self.exit_code,
            "reason": self.reason or ("Completed" if self.exit_code == 0 else "Error"),
            "startedAt": self.started_at,
            "finishedAt": self.finished_at,
            "containerID": f"process://{self.name}",
        }
        if self.signal is not None:
            state["signal"] = self.signal
        if self.message:
            state["message"] = self.message
        return state

    def status(self) -> dict[str, Any]:
        if self.exit_code is not None:
            state: dict[str, Any] = {"terminated": self.terminated_state()}
        elif self.started_at is not None:
            state = {"running": {"startedAt": self.started_at}}
        else:
            waiting = {"reason": self.waiting_reason}
            if self.waiting_message:
                waiting["message"] = self.waiting_message
            state = {"waiting": waiting}
        out: dict[str, Any] = {
            "name": self.name,
            "image": self.image,
            "imageID": "",
            "containerID": f"process://{self.name}",
            "ready": self.running,
            "started": self.running,
            "restartCount": self.restart_count,
            "state": state,
            "lastState": {"terminated": self.last_terminated} if self.last_terminated else {},
        }
        return out


def lost_containers(
    pod: Mapping[str, Any], reason: str = "ContainerStatusUnknown", message: str = ""
) -> dict[str, ContainerRecord]:
    """Records for a pod that ran under a previous kubelet process (empty if it never did).

    A container reported running is gone now: terminated with exit 137 and
    ``reason`` (a real kubelet's word for it after a node reboot); one that
    had already terminated keeps what it reported. Restart counts carry on.
    """
    statuses = {c.get("name"): c for c in pod.get("status", {}).get("containerStatuses") or []}
    ran = any(
        "running" in (c.get("state") or {})
        or "terminated" in (c.get("state") or {})
        or c.get("restartCount", 0) > 0
        for c in statuses.values()
    )
    if not ran:
        return {}
    now = now_rfc3339()
    out = {}
    for container in pod.get("spec", {}).get("containers", []):
        name = container["name"]
        seen = statuses.get(name) or {}
        state = seen.get("state") or {}
        rec = ContainerRecord(name, container.get("image", ""))
        rec.restart_count = int(seen.get("restartCount", 0))
        done = state.get("terminated") or (seen.get("lastState") or {}).get("terminated")
        if "running" in state or not done:
            rec.started_at = (state.get("running") or {}).get("startedAt") or now
            rec.finished_at = now
            rec.exit_code, rec.reason, rec.message = 137, reason, message
        else:
            rec.started_at = done.get("startedAt")
            rec.finished_at = done.get("finishedAt") or now
            rec.exit_code = int(done.get("exitCode", 137))
            rec.signal = done.get("signal")
            rec.reason = done.get("reason")
            rec.message = done.get("message", "")
        out[name] = rec
    return out


def phase(records: list[ContainerRecord], restart_policy: str) -> str:
    if any(r.running for r in records):
        return "Running"
    if records and all(r.exit_code is not None for r in records):
        failed = any(r.exit_code != 0 for r in records)
        if restart_policy == "Always" or (restart_policy == "OnFailure" and failed):
            return "Running"
        return "Failed" if failed else "Succeeded"
    return "Pending"


def _condition(kind: str, ok: bool, since: str) -> dict[str, Any]:
    return {"type": kind, "status": "True" if ok else "False", "lastTransitionTime": since}


def pod_status(
    records: list[ContainerRecord],
    restart_policy: str,
    *,
    host_ip: str,
    pod_ip: str | None,
    start_time: str,
    previous_conditions: Mapping[str, Mapping[str, Any]],
) -> dict[str, Any]:
    """The whole ``status`` for a patch; conditions keep their transition times."""
    current = phase(records, restart_policy)
    ready = current == "Running" and all(r.running for r in records)
    now = now_rfc3339()

    def cond(kind: str, ok: bool) -> dict[str, Any]:
        prev = previous_conditions.get(kind)
        status = "True" if ok else "False"
        since = prev["lastTransitionTime"] if prev and prev.get("status") == status else now
        return _condition(kind, ok, since)

    status: dict[str, Any] = {
        "phase": current,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": start_time,
        "conditions": [
            cond("PodReadyToStartContainers", pod_ip is not None),
            cond("Initialized", True),
            cond("ContainersReady", ready),
            cond("Ready", ready),
        ],
        "containerStatuses": [r.status() for r in records],
    }
    if pod_ip:
        status["podIP"] = pod_ip
        status["podIPs"] = [{"ip": pod_ip}]
    return status
