"""Pure decisions of the rendezvous protocol: given what a node observed, what to do.

Where it sits: ``rendezvous.protocol`` (the I/O side) asks these functions what to do
after each read; the liveness watcher uses ``ProgressTracker``. Nothing here
touches a store, a clock or a thread, so every rule is table-tested in
``tests/unit/agent``. The rules are those of torchelastic's rendezvous
(barrier, exclusivity, consistency, last call) expressed over an arrival
counter instead of a versioned state blob. The codecs of the values
``rendezvous.protocol`` stores (membership, stale mark, lost list) live here too.
"Nothing here touches a store, a clock or a thread" is an import-linter
contract in ``pyproject.toml``, not only this sentence.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping, Sequence
from typing import Any

from torchflex_agent.errors import (
    JobFailedError,
    RendezvousClosedError,
    StoreProtocolError,
)
from torchflex_contract import env as tfenv
from torchflex_contract.progress import RestartReason
from torchflex_contract.roles import RoleSize


@dataclasses.dataclass(frozen=True)
class RendezvousSettings:
    min_nodes: int
    max_nodes: int
    last_call: float
    join_timeout: float
    liveness_timeout: float = tfenv.DEFAULT_LIVENESS_TIMEOUT_S
    """How long a closed round's member may go without a heartbeat, on a
    waiting joiner's own clock, before the joiner declares it gone (``MemberWatch``)."""
    roles: tuple[RoleSize, ...] = ()
    """A Joint round's roles in spec order (empty otherwise): the round closes once every
    role has its minimum, admits at most each role's maximum, and orders its members by
    role (``joint_members``); ``min_nodes``/``max_nodes`` are then the sums."""

    @classmethod
    def joint(
        cls, roles: tuple[RoleSize, ...], last_call: float, join_timeout: float, liveness: float
    ) -> RendezvousSettings:
        """One round across ``roles``: its node range the sums of theirs."""
        lo, hi = sum(r.min_nodes for r in roles), sum(r.max_nodes for r in roles)
        return cls(lo, hi, last_call, join_timeout, liveness, roles)

    @property
    def role_names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.roles)

    def __post_init__(self) -> None:
        if not 1 <= self.min_nodes <= self.max_nodes:
            raise ValueError(f"need 1 <= min ({self.min_nodes}) <= max ({self.max_nodes})")


@dataclasses.dataclass(frozen=True)
class NodeDescriptor:
    """What a joining node tells its peers about itself."""

    node_id: str
    addr: str
    port: int
    """A free port on ``addr``: MASTER_PORT if this node becomes node rank 0."""
    nproc: int
    watch_port: int = 0
    """The agent's presence port on ``addr`` (``rendezvous.liveness.PresenceServer``); 0: none.

    Its predecessor in the ring holds a TCP connection to it: when the
    agent's process dies the kernel closes the connection and the watcher
    knows at once, without waiting out a heartbeat timeout. Absent in
    descriptors of agents that predate it (read as 0)."""
    prev_rank: int = -1
    """This node's rank in the last round it ran in; -1 for a newcomer (see ``rank_order``)."""
    agent_store: bool = False
    """The agent already serves a TCPStore on ``port`` for its workers' process group.

    If this node becomes node rank 0, workers get
    ``TORCHELASTIC_USE_AGENT_STORE=True`` and all connect as clients to a
    store that is listening before any of them starts; otherwise worker
    rank 0 binds it and early peers back off and retry (0.2-0.7 s)."""
    pod: str = ""
    """The member's pod (``metadata.name``; env ``TORCHFLEX_POD_NAME``), so peers can
    name a lost member's pod in their reports; empty outside Kubernetes or in
    descriptors of agents that predate it."""
    role: str = ""
    """The member's training role (``--role``); empty in descriptors of agents that
    predate roles. A Joint round orders its members by it (``rank_order``)."""
    service_ports: tuple[int, ...] = ()
    """Per local rank: the free port that worker may serve on (``env.SERVICE_PORT``),
    published to the other roles in the roles file (``workers.roster``)."""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: Any) -> NodeDescriptor:
        try:
            return cls(
                str(raw["node_id"]),
                str(raw["addr"]),
                int(raw["port"]),
                int(raw["nproc"]),
                int(raw.get("watch_port", 0)),
                int(raw.get("prev_rank", -1)),
                bool(raw.get("agent_store", False)),
                str(raw.get("pod", "")),
                str(raw.get("role", "")),
                tuple(int(p) for p in raw.get("service_ports", ())),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StoreProtocolError(f"malformed node descriptor {raw!r}: {exc}") from exc


def rank_order(nodes: Sequence[NodeDescriptor], roles: Sequence[str] = ()) -> list[NodeDescriptor]:
    """Node ranks of a closing round: previous ranks kept in order, newcomers last.

    ``roles`` (a Joint round: every role in spec order) sorts by role first, so
    each role's ranks are contiguous. Ties keep arrival order (the sort is
    stable), so every closer computes the same list from the same descriptors.
    """
    order = {name: i for i, name in enumerate(roles)}
    return sorted(
        nodes, key=lambda n: (order.get(n.role, len(order)), n.prev_rank < 0, n.prev_rank)
    )


def encode_membership(nodes: Sequence[NodeDescriptor], closer: str) -> bytes:
    """The value of a round's ``closed`` key; ``closer`` makes it unique per writer."""
    return json.dumps({"closer": closer, "nodes": [n.to_json() for n in nodes]}).encode()


def decode_membership(raw: bytes) -> tuple[NodeDescriptor, ...]:
    try:
        data = json.loads(raw)
        nodes = data["nodes"]
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreProtocolError(f"malformed round membership: {exc}") from exc
    return tuple(NodeDescriptor.from_json(n) for n in nodes)


SILENT = "silent"
"""Lost by heartbeat timeout: frozen, partitioned, powered off."""
EXITED = "exited"
"""Lost by its presence link closing: the agent's process is gone."""


def decode_lost(raw: bytes | None) -> tuple[tuple[int, str], ...]:
    """A round's ``lost`` key as ((rank, how), ...); malformed entries are skipped."""
    if not raw:
        return ()
    try:
        data = json.loads(raw)
    except ValueError:
        return ()
    out = []
    for item in data if isinstance(data, list) else []:
        if isinstance(item, dict) and isinstance(item.get("rank"), int):
            out.append((int(item["rank"]), str(item.get("how", ""))))
    return tuple(out)


def encode_lost(entries: tuple[tuple[int, str], ...]) -> bytes:
    return json.dumps([{"rank": r, "how": how} for r, how in entries]).encode()


@dataclasses.dataclass(frozen=True)
class StaleMark:
    reason: RestartReason
    by: str
    detail: str = ""

    def encode(self) -> bytes:
        return json.dumps(
            {"reason": self.reason.value, "by": self.by, "detail": self.detail}
        ).encode()

    @classmethod
    def decode(cls, raw: bytes) -> StaleMark:
        try:
            data = json.loads(raw)
            return cls(RestartReason(data["reason"]), str(data["by"]), str(data.get("detail", "")))
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreProtocolError(f"malformed stale mark {raw!r}: {exc}") from exc


def decode_job_closure(raw: bytes | None) -> tuple[str, str] | None:
    """The job's ``job-closed`` key as (outcome, message), None if absent."""
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        return str(data["outcome"]), str(data.get("message", ""))
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreProtocolError(f"malformed job closure: {exc}") from exc


def raise_for_job_closure(closure: tuple[str, str] | None) -> None:
    """Raise the error a closed job means to a joiner: failed or otherwise over."""
    if closure is None:
        return
    outcome, message = closure
    if outcome == "failed":
        raise JobFailedError(message or "the job failed on another node")
    raise RendezvousClosedError(f"rendezvous closed: job {outcome}")


@dataclasses.dataclass(frozen=True)
class RoundView:
    """The keys a joiner decides on, read together (one request, ``Rendezvous._view``)."""

    job_closed: bytes | None
    closed: bytes | None
    stale: bytes | None


@dataclasses.dataclass(frozen=True)
class RoundPeek:
    """An onlooker's read of a job's newest round (another role's, for the roles file)."""

    round: int
    """The round ``nodes`` formed (-1: no round yet)."""
    nodes: tuple[NodeDescriptor, ...] | None
    """Its membership; None when no round closed yet."""
    stale: bool
    """The round was marked stale: its members are re-forming."""
    forming: bool
    """A newer round is open (``nodes`` are the last closed round's) or none closed yet."""


@dataclasses.dataclass(frozen=True)
class RendezvousResult:
    """A closed round as seen by one of its members."""

    round: int
    node_rank: int
    nodes: tuple[NodeDescriptor, ...]

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def world_size(self) -> int:
        return sum(n.nproc for n in self.nodes)

    @property
    def rank_offset(self) -> int:
        """Global rank of this node's local rank 0."""
        return sum(n.nproc for n in self.nodes[: self.node_rank])

    @property
    def role_rank_offset(self) -> int:
        """Role rank of this node's local rank 0: the workers of its role before it
        (torchrun's ``_assign_worker_ranks``: cumulative per role, in node order)."""
        role = self.me.role
        return sum(n.nproc for n in self.nodes[: self.node_rank] if n.role == role)

    @property
    def role_world_size(self) -> int:
        """Workers of this node's role in the round."""
        return sum(n.nproc for n in self.nodes if n.role == self.me.role)

    @property
    def me(self) -> NodeDescriptor:
        return self.nodes[self.node_rank]

    @property
    def master(self) -> NodeDescriptor:
        return self.nodes[0]

    @property
    def successor(self) -> int | None:
        """The node rank this member watches, or None when alone."""
        return successor(self.node_rank, self.num_nodes)


def successor(node_rank: int, num_nodes: int) -> int | None:
    """Ring successor: every member is watched by exactly one other member."""
    if num_nodes <= 1:
        return None
    return (node_rank + 1) % num_nodes


class ArrivalRole(enum.Enum):
    CLOSER = "closer"
    """This arrival filled the round to max: close it now, no last call."""
    CANDIDATE = "candidate"
    """Within max: a member if the round closes with this index included."""


def arrival_role(index: int, max_nodes: int) -> ArrivalRole:
    return ArrivalRole.CLOSER if index + 1 == max_nodes else ArrivalRole.CANDIDATE


@dataclasses.dataclass(frozen=True)
class CloseDecision:
    close: bool
    wait: float
    """Seconds to block on the ``closed`` key before deciding again."""
    min_reached_at: float | None
    """When this node first saw min arrivals, on its own monotonic clock."""


def close_decision(
    *,
    now: float,
    arrivals: int,
    settings: RendezvousSettings,
    min_reached_at: float | None,
    fallback_wait: float,
    expected: int | None = None,
    role_counts: Mapping[str, int] | None = None,
) -> CloseDecision:
    """Whether a waiting joiner should close the round now, else how long to wait.

    ``role_counts`` (a Joint round: arrivals per role) replaces the total's
    tests: the round is full when every role is at its maximum and has its
    minimum when every role has its own.

    The last-call window runs on the deciding node's own clock from the
    moment it first saw ``min`` arrivals; wall clocks are never compared.
    ``expected`` (see ``expected_next``) skips the window once everyone the
    previous round says should come has come: after a loss the survivors
    re-form without waiting for a node that is known to be gone.
    """
    full, short = arrivals >= settings.max_nodes, arrivals < settings.min_nodes
    if role_counts is not None and settings.roles:
        full = all(role_counts.get(r.name, 0) >= r.max_nodes for r in settings.roles)
        short = any(role_counts.get(r.name, 0) < r.min_nodes for r in settings.roles)
    if full:
        return CloseDecision(True, 0.0, min_reached_at if min_reached_at is not None else now)
    if short:
        return CloseDecision(False, fallback_wait, None)
    if expected is not None and arrivals >= expected:
        return CloseDecision(True, 0.0, min_reached_at if min_reached_at is not None else now)
    seen = min_reached_at if min_reached_at is not None else now
    left = seen + settings.last_call - now
    if left <= 0:
        return CloseDecision(True, 0.0, seen)
    return CloseDecision(False, left, seen)


def expected_next(
    prev_members: int, reason: RestartReason, waiting: int, max_nodes: int
) -> int | None:
    """How many nodes the round after one that ended for ``reason`` should wait for.

    Every member of the previous round re-joins except one that left or was
    lost; agents that asked to join (the round's ``waiting`` counter) come
    too. None when there is nothing to go by (the full last call applies).
    Being wrong is safe: too low closes early and a late node joins the next
    round (MemberJoined); too high only means the last call runs out.
    """
    if prev_members < 1:
        return None
    gone = 1 if reason in (RestartReason.MEMBER_LOST, RestartReason.MEMBER_LEFT) else 0
    expected = prev_members - gone + max(0, waiting)
    return max(1, min(expected, max_nodes))


class Standing(enum.Enum):
    MEMBER = "member"
    WAITER = "waiter"


def joint_members(
    arrived: Sequence[NodeDescriptor], roles: Sequence[RoleSize]
) -> list[NodeDescriptor]:
    """A Joint round's members: arrivals in order, each role up to its maximum (a node of
    an unknown role or one over its role's maximum waits for the next round), ordered
    by role, then previous rank (``rank_order``): each role's ranks are contiguous."""
    room = {r.name: r.max_nodes for r in roles}
    admitted = []
    for node in arrived:
        if room.get(node.role, 0) > 0:
            room[node.role] -= 1
            admitted.append(node)
    return rank_order(admitted, [r.name for r in roles])


def role_counts(arrived: Sequence[NodeDescriptor]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in arrived:
        counts[node.role] = counts.get(node.role, 0) + 1
    return counts


def joint_room(nodes: Sequence[NodeDescriptor], role: str, roles: Sequence[RoleSize]) -> bool:
    """Whether a Joint round has room for one more node of ``role`` (a late joiner's test)."""
    cap = next((r.max_nodes for r in roles if r.name == role), 0)
    return sum(1 for n in nodes if n.role == role) < cap


def standing(index: int, closed_count: int) -> Standing:
    """Members are exactly the arrival indices below the closed count."""
    return Standing.MEMBER if index < closed_count else Standing.WAITER


def waiter_marks_stale(closed_count: int, max_nodes: int) -> bool:
    """A late joiner re-forms a running round only if it has room to grow."""
    return closed_count < max_nodes


@dataclasses.dataclass
class ProgressTracker:
    """Has a heartbeat counter stalled for ``timeout`` on the observer's own clock?"""

    timeout: float
    last_value: int | None = None
    last_change: float | None = None

    def observe(self, value: int | None, now: float) -> bool:
        """Record one reading; True when the watched member counts as lost."""
        if self.last_change is None or value != self.last_value:
            self.last_value = value
            self.last_change = now
            return False
        return now - self.last_change >= self.timeout


@dataclasses.dataclass
class MemberWatch:
    """A waiting joiner's watch over a full round it is not in: which members are gone?

    A full running round ends when a member leaves or its ring predecessor
    sees it die. When every member is gone at once (the whole group killed,
    a single-pod job that crashed) nobody is left to say so, and the joiner
    would wait on the round until its join timeout. So the joiner reads the
    members' heartbeat counters every wait slice: one that has not moved for
    ``timeout`` on the joiner's own monotonic clock is gone (wall clocks of
    different nodes are never compared), as in the ring watch.
    """

    timeout: float
    trackers: dict[int, ProgressTracker] = dataclasses.field(default_factory=dict)

    def observe(self, beats: Mapping[int, int | None], now: float) -> tuple[int, ...]:
        """Record one reading per member rank; the ranks whose counters stalled, in order."""
        stalled = []
        for rank in sorted(beats):
            tracker = self.trackers.setdefault(rank, ProgressTracker(self.timeout))
            if tracker.observe(beats[rank], now):
                stalled.append(rank)
        return tuple(stalled)


def parse_counter(raw: bytes | None) -> int | None:
    """A decimal counter's value; None if absent or unreadable (both read as "no beat")."""
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        return None


# -- node check pairing (rendezvous.node_check) -------------------------


@dataclasses.dataclass(frozen=True)
class CheckOffer:
    """A node waiting in the node-check lobby for a peer to run a collective with."""

    node: str
    name: str
    """How reports name it: its pod, else its node id."""
    addr: str
    port: int
    """Where its check program hosts the pair's TCPStore once claimed."""
    until: float
    """Wall-clock time (seconds since the epoch) after which it no longer waits."""

    def encode(self) -> bytes:
        return json.dumps(dataclasses.asdict(self)).encode()


def open_offer(raw: bytes | None, me: str, now: float) -> CheckOffer | None:
    """The lobby's offer if another node still waits there; None if the lobby is free.

    Free: empty, a claim (that pair is formed), a withdrawn offer, our own,
    an offer past its ``until`` (its agent gave up or died) or an unreadable value.
    """
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        offer = CheckOffer(
            str(data["node"]),
            str(data["name"]),
            str(data["addr"]),
            int(data["port"]),
            float(data["until"]),
        )
    except (ValueError, TypeError, KeyError):
        return None
    return offer if offer.node != me and offer.until > now else None


def encode_claim(offer: CheckOffer, me: str, name: str) -> bytes:
    """The lobby value that pairs ``me`` (called ``name`` in reports) with ``offer``'s node."""
    return json.dumps({"claim": offer.node, "by": me, "name": name}).encode()


def claimed_by(raw: bytes | None, me: str) -> str | None:
    """The name of the node whose claim pairs it with ``me``; None if the value is no such claim."""
    try:
        data = json.loads(raw or b"")
        return str(data["name"]) if data.get("claim") == me else None
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
