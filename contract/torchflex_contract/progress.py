"""What an agent reports about itself, and where.

Where it sits: the agent serves this as JSON at ``GET /status`` on its
health port (``env.HEALTH_PORT``) and writes a final one to the container's
termination message file when it exits; the operator reads either and folds
them into the job status (world size, rendezvous round, restarts, last
failure). A plain dataclass so both sides parse it the same way.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Any, Final

STATUS_PATH: Final = "/status"
HEALTH_PATH: Final = "/healthz"
TERMINATION_LOG: Final = "/dev/termination-log"
MAX_TERMINATION_MESSAGE: Final = 4096


class AgentState(enum.StrEnum):
    INIT = "Init"
    RENDEZVOUS = "Rendezvous"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    LEAVING = "Leaving"


class RestartReason(enum.StrEnum):
    """Why the worker group was last restarted."""

    NONE = ""
    MEMBER_LOST = "MemberLost"
    MEMBER_JOINED = "MemberJoined"
    MEMBER_LEFT = "MemberLeft"
    WORKER_FAILED = "WorkerFailed"
    STORE_LOST = "StoreLost"


@dataclasses.dataclass(frozen=True)
class AgentReport:
    state: AgentState
    round: int = -1
    world_size: int = 0
    node_rank: int = -1
    nodes: int = 0
    restarts: int = 0
    last_restart_reason: RestartReason = RestartReason.NONE
    message: str = ""
    lost_pods: tuple[str, ...] = ()
    """Pods (``metadata.name``) the group declared lost (silent: no heartbeat, no
    presence) when round ``lost_round`` went stale. The operator fences and
    replaces such a pod when its own agent does not show it in a newer round."""
    lost_round: int = -1
    store_error: str = ""
    """Non-empty while this agent cannot reach its rendezvous store (the last
    operation's error, bounded by the per-operation deadline): the operator
    surfaces it as a condition and an Event."""

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data["state"] = self.state.value
        data["last_restart_reason"] = self.last_restart_reason.value
        data["lost_pods"] = list(self.lost_pods)
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> AgentReport:
        """Parse a report; raises ValueError on anything malformed."""
        try:
            raw: Any = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"agent report is not JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise ValueError("agent report must be a JSON object")
        try:
            return cls(
                state=AgentState(raw["state"]),
                round=int(raw.get("round", -1)),
                world_size=int(raw.get("world_size", 0)),
                node_rank=int(raw.get("node_rank", -1)),
                nodes=int(raw.get("nodes", 0)),
                restarts=int(raw.get("restarts", 0)),
                last_restart_reason=RestartReason(raw.get("last_restart_reason", "")),
                message=str(raw.get("message", ""))[:MAX_TERMINATION_MESSAGE],
                lost_pods=tuple(str(p) for p in raw.get("lost_pods") or ()),
                lost_round=int(raw.get("lost_round", -1)),
                store_error=str(raw.get("store_error", ""))[:MAX_TERMINATION_MESSAGE],
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise ValueError(f"malformed agent report: {exc}") from exc
