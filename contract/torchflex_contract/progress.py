"""What an agent reports about itself, and where.

Where it sits: the agent serves this as JSON at ``GET /status`` on its
health port (``env.HEALTH_PORT``) and writes a final one to the container's
termination message file when it exits; the operator reads either and folds
them into the job status (world size, rendezvous round, restarts, last
failure, root cause, training progress). A plain dataclass so both sides
parse it the same way; every free-text field is bounded here, on parse,
so a report can never grow the job status without limit.

``GET /status?after=R&wait=S`` is the long-poll form (``long_poll_path``):
the agent answers as soon as its rendezvous round is no longer ``R`` (or it
is ending), at the latest after ``S`` seconds (capped at
``LONG_POLL_MAX_S``), so the operator can hold one cheap request per job and
see a re-formed group within a second instead of at its next poll.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

_T = TypeVar("_T")

STATUS_PATH: Final = "/status"
HEALTH_PATH: Final = "/healthz"
TERMINATION_LOG: Final = "/dev/termination-log"
MAX_TERMINATION_MESSAGE: Final = 4096
"""Kubernetes keeps at most this many bytes of a termination message."""

LONG_POLL_MAX_S: Final = 30.0
"""Longest an agent holds a ``GET /status?after=..`` open (a longer ``wait`` is cut)."""

# Bounds of a root cause (``RootCause``): together well under
# MAX_TERMINATION_MESSAGE with the rest of a report, before any trimming.
MAX_ERROR_TYPE: Final = 128
MAX_ERROR_MESSAGE: Final = 1024
MAX_FRAMES: Final = 8
MAX_FRAME: Final = 200
MAX_HANG_STACK: Final = 1536
"""Characters of a hung worker's stack a report carries (the innermost frames: its tail)."""
MAX_STALL_RANKS: Final = 8
"""Ranks whose stacks a ``StallReport`` carries (the culprit first, then by rank)."""
MAX_STALL_STACK: Final = 1024
"""Characters of each rank's stack in a ``StallReport`` (its innermost frames)."""


class AgentState(enum.StrEnum):
    INIT = "Init"
    RENDEZVOUS = "Rendezvous"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    LEAVING = "Leaving"


ENDING_STATES: Final = frozenset({AgentState.SUCCEEDED, AgentState.FAILED, AgentState.LEAVING})
"""After these the agent's round does not change again: a long poll answers at once."""


class RestartReason(enum.StrEnum):
    """Why the worker group was last restarted."""

    NONE = ""
    MEMBER_LOST = "MemberLost"
    MEMBER_JOINED = "MemberJoined"
    MEMBER_LEFT = "MemberLeft"
    WORKER_FAILED = "WorkerFailed"
    STORE_LOST = "StoreLost"
    HANG = "Hang"
    """No training progress anywhere in the job for the hang timeout: every member
    recorded its workers' stacks and restarted them (a counted failure)."""
    ROLE_FAILED = "RoleFailed"
    """A role with ``failureScope: Job`` (``env.JOB_SCOPED_ROLES``) re-formed after a
    failure or a loss: this role re-forms with it (not counted against its budget)."""


def _bounded(text: object, limit: int) -> str:
    """``text`` as a string of at most ``limit`` characters (its head, marked if cut)."""
    out = str(text)
    return out if len(out) <= limit else out[: max(0, limit - 3)] + "..."


@dataclasses.dataclass(frozen=True)
class RootCause:
    """The exception that ended a worker first, as its error file recorded it.

    Written by the worker bootstrap (any uncaught exception) or by torch's
    ``@record`` (``TORCHELASTIC_ERROR_FILE``); read by the agent, which
    reports the earliest one of a failed round, as torchrun does.
    """

    type: str
    """The exception class name, e.g. ``ValueError`` (empty when only a message is known)."""
    message: str
    """``str(exception)``: at most ``MAX_ERROR_MESSAGE`` characters."""
    frames: tuple[str, ...] = ()
    """The innermost ``MAX_FRAMES`` frames, outermost first, ``file:line in function``."""
    rank: int = -1
    """Global rank of the worker that raised it."""
    exit_code: int = 0
    round: int = -1
    timestamp: float = 0.0
    """Unix time the worker recorded it (0 when unknown)."""

    def summary(self) -> str:
        """``Type: message`` (what torch's error file calls the message)."""
        if self.type and self.message:
            return f"{self.type}: {self.message}"
        return self.type or self.message

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["frames"] = list(self.frames)
        return data

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> RootCause:
        """Parse and bound; raises ValueError/TypeError/KeyError on a malformed one."""
        frames = raw.get("frames") or ()
        if not isinstance(frames, list | tuple):
            raise TypeError("root_cause.frames must be a list")
        return cls(
            type=_bounded(raw["type"], MAX_ERROR_TYPE),
            message=_bounded(raw.get("message", ""), MAX_ERROR_MESSAGE),
            frames=tuple(_bounded(f, MAX_FRAME) for f in frames[-MAX_FRAMES:]),
            rank=int(raw.get("rank", -1)),
            exit_code=int(raw.get("exit_code", 0)),
            round=int(raw.get("round", -1)),
            timestamp=_finite(raw.get("timestamp", 0.0)),
        )


class HangKind(enum.StrEnum):
    """Where a worker that would not exit was stuck (``HangReport.kind``)."""

    TEARDOWN = "Teardown"
    """Its script had returned, or it was inside ``destroy_process_group``: the work
    was done, the process would not end. The agent ends it with the script's code."""
    COMPLETION = "Completion"
    """Another member finished the job and this worker was still in the script's own
    code after the completion grace: it is ended and the member fails."""


@dataclasses.dataclass(frozen=True)
class HangReport:
    """A worker the agent ended because it would not exit (docs/failure-model.md)."""

    kind: HangKind
    rank: int
    """Global rank of the worker (the lowest, when several hung)."""
    seconds: float
    """How long it ran on after it finished (or after the job completed elsewhere)."""
    round: int = -1
    stack: str = ""
    """Its threads' stacks when it was ended (faulthandler; native frames too when
    ``py-spy`` is installed): the innermost ``MAX_HANG_STACK`` characters."""

    def summary(self) -> str:
        what = (
            "hung in teardown after its script returned"
            if self.kind is HangKind.TEARDOWN
            else "still running after the job completed on another member"
        )
        return f"rank {self.rank} {what}; ended after {self.seconds:.0f} s"

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["kind"] = self.kind.value
        return data

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> HangReport:
        stack = str(raw.get("stack", ""))
        return cls(
            kind=HangKind(raw["kind"]),
            rank=int(raw.get("rank", -1)),
            seconds=_finite(raw.get("seconds", 0.0)),
            round=int(raw.get("round", -1)),
            stack=stack[-MAX_HANG_STACK:],
        )


@dataclasses.dataclass(frozen=True)
class RankStall:
    """One rank's state when the job was declared hung (``StallReport.ranks``)."""

    rank: int
    pod: str = ""
    steps: int = 0
    """Optimizer steps (or reported steps) it completed in the hung round."""
    idle: float = 0.0
    """Seconds since it last made progress (a forward, a step, a report)."""
    waiting: bool = False
    """Its main thread was inside torch's collectives or autograd (waiting on a peer)."""
    stack: str = ""
    """Its threads' stacks (innermost ``MAX_STALL_STACK`` characters)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> RankStall:
        return cls(
            rank=int(raw["rank"]),
            pod=_bounded(raw.get("pod", ""), 253),
            steps=int(raw.get("steps", 0)),
            idle=_finite(raw.get("idle", 0.0)),
            waiting=raw.get("waiting") is True,
            stack=str(raw.get("stack", ""))[-MAX_STALL_STACK:],
        )


@dataclasses.dataclass(frozen=True)
class StallReport:
    """A hang the agents declared: no progress anywhere for ``timeout`` seconds.

    Assembled by the agent holding node rank 0 from every member's entry in the
    store (``rendezvous.records``), the culprit first: the rank that stopped
    taking part (``loop.logic.stall.culprit``).
    """

    round: int
    rank: int
    """The rank that stopped progressing (-1 if none stood out)."""
    pod: str = ""
    timeout: float = 0.0
    """The hang timeout in force (explicit or derived from step times)."""
    ranks: tuple[RankStall, ...] = ()

    def summary(self) -> str:
        who = f"rank {self.rank} (pod {self.pod or '?'})" if self.rank >= 0 else "no rank"
        return (
            f"no training progress for {self.timeout:.0f} s in round {self.round}: "
            f"{who} stopped taking part"
        )

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["ranks"] = [r.to_dict() for r in self.ranks]
        return data

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> StallReport:
        ranks = raw.get("ranks") or []
        if not isinstance(ranks, list):
            raise TypeError("ranks must be a list")
        return cls(
            round=int(raw["round"]),
            rank=int(raw.get("rank", -1)),
            pod=_bounded(raw.get("pod", ""), 253),
            timeout=_finite(raw.get("timeout", 0.0)),
            ranks=tuple(RankStall.from_dict(r) for r in ranks[:MAX_STALL_RANKS]),
        )


@dataclasses.dataclass(frozen=True)
class StragglerReport:
    """A node whose workers' forward passes take much longer than the other nodes'.

    Reported by the agent holding node rank 0 (``loop.logic.straggler``): the node's
    mean forward time over the latest window and its ratio to the other nodes' median.
    """

    node_rank: int
    pod: str = ""
    forward_s: float = 0.0
    ratio: float = 0.0
    round: int = -1

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> StragglerReport:
        return cls(
            node_rank=int(raw["node_rank"]),
            pod=_bounded(raw.get("pod", ""), 253),
            forward_s=_finite(raw.get("forward_s", 0.0)),
            ratio=_finite(raw.get("ratio", 0.0)),
            round=int(raw.get("round", -1)),
        )


@dataclasses.dataclass(frozen=True)
class Progress:
    """Training progress one agent's workers reported (see docs/agent.md).

    Only the worker with ``LOCAL_RANK`` 0 reports, through the file named by
    ``env.PROGRESS_FILE`` (``torchflex_agent.progress.report_step``; the
    checkpoint helper reports every save by itself). An agent whose workers
    never reported has no ``Progress`` at all (``AgentReport.progress`` None).
    """

    step: int = -1
    """The latest step a worker reported; -1 if it reported only checkpoints."""
    steps_per_second: float = 0.0
    """Over the worker's last few reports (computed by the agent); 0 if unknown."""
    checkpoint_step: int = -1
    """The step of the latest checkpoint the worker saved; -1 if none."""
    updated: float = 0.0
    """Unix time of the latest report (how fresh ``step`` is)."""
    round: int = -1
    """The rendezvous round of the worker that reported it."""

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Progress:
        return cls(
            step=int(raw.get("step", -1)),
            steps_per_second=_finite(raw.get("steps_per_second", 0.0)),
            checkpoint_step=int(raw.get("checkpoint_step", -1)),
            updated=_finite(raw.get("updated", 0.0)),
            round=int(raw.get("round", -1)),
        )


def _finite(value: object) -> float:
    out = float(value)  # type: ignore[arg-type]
    if not math.isfinite(out):
        raise ValueError(f"not a finite number: {value!r}")
    return out


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
    holds_rank0: bool = False
    """This agent's workers include global rank 0 in ``round`` (the pod index is
    not the rank: node ranks follow rendezvous order)."""
    root_cause: RootCause | None = None
    """The first worker exception of this agent's latest failed round, if any
    worker recorded one (``env.ERROR_FILE``); kept until another replaces it."""
    progress: Progress | None = None
    """What the workers reported about training; None when they report nothing."""
    hang: HangReport | None = None
    """A worker this agent ended because it would not exit (teardown or completion hang)."""
    stall: StallReport | None = None
    """The latest hang the group declared (no progress for the hang timeout), with every
    rank's stack; only the agent holding node rank 0 assembles and reports it."""
    stragglers: tuple[StragglerReport, ...] = ()
    """Nodes of the current round much slower than the others (node rank 0 reports)."""

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data["state"] = self.state.value
        data["last_restart_reason"] = self.last_restart_reason.value
        data["lost_pods"] = list(self.lost_pods)
        data["root_cause"] = self.root_cause.to_dict() if self.root_cause else None
        data["hang"] = self.hang.to_dict() if self.hang else None
        data["stall"] = self.stall.to_dict() if self.stall else None
        data["stragglers"] = [st.to_dict() for st in self.stragglers]
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
                holds_rank0=raw.get("holds_rank0") is True,
                root_cause=_optional(RootCause.from_dict, raw.get("root_cause")),
                progress=_optional(Progress.from_dict, raw.get("progress")),
                hang=_optional(HangReport.from_dict, raw.get("hang")),
                stall=_optional(StallReport.from_dict, raw.get("stall")),
                stragglers=tuple(
                    StragglerReport.from_dict(st) for st in (raw.get("stragglers") or [])[:8]
                ),
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise ValueError(f"malformed agent report: {exc}") from exc


def _optional(parse: Callable[[Mapping[str, Any]], _T], raw: object) -> _T | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise TypeError(f"expected an object, got {type(raw).__name__}")
    return parse(raw)


def termination_text(report: AgentReport, limit: int = MAX_TERMINATION_MESSAGE) -> str:
    """The report as JSON of at most ``limit`` characters (ASCII, so bytes too).

    What gives way, in order: a declared hang's stacks (the live ``/status``
    carries them; the operator read them while the group re-formed), then the
    hang itself, a hung worker's stack (its outermost part), the root
    cause's outermost frames, then the root cause's message, then the
    report's message (each keeps its head), never the JSON structure or the
    numbers.
    """
    text = report.to_json()
    for _ in range(64):  # frames go one by one (MAX_FRAMES), texts shrink by a factor
        if len(text) <= limit:
            break
        cause = report.root_cause
        hang = report.hang
        stall = report.stall
        if stall is not None and any(r.stack for r in stall.ranks):
            ranks = tuple(dataclasses.replace(r, stack="") for r in stall.ranks)
            report = dataclasses.replace(report, stall=dataclasses.replace(stall, ranks=ranks))
        elif stall is not None:
            report = dataclasses.replace(report, stall=None)
        elif hang is not None and hang.stack:
            keep = len(_shrunk(hang.stack, len(text), limit))
            hang = dataclasses.replace(hang, stack=hang.stack[len(hang.stack) - keep :])
            report = dataclasses.replace(report, hang=hang)
        elif cause is not None and cause.frames:
            cause = dataclasses.replace(cause, frames=cause.frames[1:])
            report = dataclasses.replace(report, root_cause=cause)
        elif cause is not None and cause.message:
            cause = dataclasses.replace(cause, message=_shrunk(cause.message, len(text), limit))
            report = dataclasses.replace(report, root_cause=cause)
        elif report.message:
            report = dataclasses.replace(report, message=_shrunk(report.message, len(text), limit))
        else:
            break
        text = report.to_json()
    return text


def _shrunk(message: str, size: int, limit: int) -> str:
    """The head of ``message``, cut in proportion to how far ``size`` is over ``limit``.

    Escaping makes the JSON longer than the text it holds, hence the scaling
    (and always at least one character less, so the caller's loop ends).
    """
    over = size - limit
    keep = len(message) - max(1, int(over * len(message) / max(1, size)) + 16)
    return message[: max(0, keep)]


@dataclasses.dataclass(frozen=True)
class StatusQuery:
    """A parsed ``GET /status`` target: a plain read, or a long poll."""

    after: int | None = None
    """Answer once the round is no longer this one (None: answer at once)."""
    wait: float = 0.0
    """Seconds to hold the request at most (capped at ``LONG_POLL_MAX_S``)."""


def long_poll_path(after: int, wait: float) -> str:
    """The request target for a long poll on round ``after``."""
    return f"{STATUS_PATH}?after={after}&wait={wait:g}"


def parse_status_target(target: str) -> StatusQuery | None:
    """None unless ``target`` is the status path; raises ValueError on a bad query."""
    parts = urllib.parse.urlsplit(target)
    if parts.path != STATUS_PATH:
        return None
    query = urllib.parse.parse_qs(parts.query, strict_parsing=False)
    if "after" not in query:
        return StatusQuery()
    try:
        after = int(query["after"][-1])
        wait = float(query.get("wait", [str(LONG_POLL_MAX_S)])[-1])
    except ValueError as exc:
        raise ValueError(f"bad status query {parts.query!r}: {exc}") from exc
    if not math.isfinite(wait) or wait < 0:
        raise ValueError(f"bad status query {parts.query!r}: wait must be >= 0")
    return StatusQuery(after, min(wait, LONG_POLL_MAX_S))
