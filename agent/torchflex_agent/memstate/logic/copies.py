"""Pure decisions of the opt-in state API: which in-memory copy a group resumes from.

Where it sits: ``memstate.shm`` stores each worker's copy of its last completed
step with a ``CopyMeta`` header; after a re-form every worker of the new round
reads its own copy's header, the group gathers them, and :func:`choose_source`
(run identically on every rank, so all ranks agree without another message)
says whose copy the group resumes from and whether it must be broadcast.
Table-tested in ``tests/unit/agent/test_agent_state_logic.py``; held to the
agent's pure import-linter contract (no clock, no socket, no torch).

The fencing rule, reusing ``fence``'s notions: a copy is keyed by
``(incarnation, round, step)``. Rounds only compare within one store
incarnation (a restarted c10d store numbers rounds from 0 again). Among
copies of the chosen incarnation the newest *round* wins, then the highest
step: a member declared lost in round r (frozen, partitioned) that comes
back holds a round-r copy, and the group that replaced it trained in round
r+1 or later, so its copy is never used, even at a higher step. (A worker
only writes a copy while its lease names its round, so a fenced member's
copy never gets past the step its group completed with it.)
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

from torchflex_contract.progress import RestartReason

MAGIC = "torchflex-state-v1"
"""First field of a copy's header line: files of another format are not copies."""


@dataclasses.dataclass(frozen=True, order=True)
class CopyMeta:
    """What one in-memory copy holds: the state after ``step`` of ``round`` (fenced key)."""

    incarnation: str
    round: int
    step: int
    rank: int = -1
    """The global rank that wrote it: sharded state's shard index (any rank's copy of
    replicated state is equal)."""
    world: int = 0
    base: int = -1
    """Sharded state: a copy ``restore`` committed again under a new round holds the
    state of ``(incarnation, base, step)`` too (``memstate.logic.shards.plan_shards``); -1 else."""

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.incarnation, self.round, self.step)

    def header(self) -> bytes:
        """One JSON line, the first of the copy's file."""
        fields = dataclasses.asdict(self)
        return (json.dumps({"magic": MAGIC, **fields}, sort_keys=True) + "\n").encode()

    @classmethod
    def from_header(cls, line: bytes) -> CopyMeta:
        """Parse :meth:`header`'s line; ``ValueError`` if it is not one."""
        try:
            raw = json.loads(line.decode())
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not a state copy header: {exc}") from exc
        if not isinstance(raw, dict) or raw.get("magic") != MAGIC:
            raise ValueError("not a state copy header")
        try:
            return cls(
                str(raw["incarnation"]),
                int(raw["round"]),
                int(raw["step"]),
                int(raw.get("rank", -1)),
                int(raw.get("world", 0)),
                int(raw.get("base", -1)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed state copy header: {exc}") from exc


def may_write(current: CopyMeta | None, new: CopyMeta) -> bool:
    """Whether a worker may replace its node's copy ``current`` with ``new`` (pure).

    Never with an older round of the same incarnation, never with a lower step
    of the same round: a copy only moves forward. A copy of another
    incarnation is replaced (the store, and round numbering, started over).
    """
    if current is None or current.incarnation != new.incarnation:
        return True
    return (new.round, new.step) >= (current.round, current.step)


def usable_incarnation(copies: Sequence[CopyMeta | None], current: str) -> str | None:
    """Which incarnation's copies may be used: the current one if any copy has it;
    else the only one present (the store restarted: every copy predates it, and
    rounds still compare among them); else none (several old numberings that
    cannot be ordered against each other)."""
    seen = {c.incarnation for c in copies if c is not None}
    if current in seen:
        return current
    if len(seen) == 1:
        return seen.pop()
    return None


@dataclasses.dataclass(frozen=True)
class Source:
    """The copy the group resumes from."""

    rank: int
    """The rank (in the new round) that holds it and broadcasts it if needed."""
    meta: CopyMeta
    broadcast: bool
    """False when every rank holds a copy with the same key: each loads its own."""

    def holders(self, copies: Sequence[CopyMeta | None]) -> list[int]:
        return [i for i, c in enumerate(copies) if c is not None and c.key == self.meta.key]


def choose_source(copies: Sequence[CopyMeta | None], current: str) -> Source | None:
    """Whose copy the new round resumes from (index = rank in the new round); None: nobody
    holds a usable one (first start, or every copy was lost): the script falls back to
    its disk checkpoint or starts fresh.

    The newest (round, step) of the usable incarnation; ties go to the lowest
    rank (every rank computes the same answer from the same gathered list).
    """
    incarnation = usable_incarnation(copies, current)
    if incarnation is None:
        return None
    best: tuple[int, int] | None = None
    best_rank = -1
    for rank, c in enumerate(copies):
        if c is None or c.incarnation != incarnation:
            continue
        if best is None or (c.round, c.step) > best:
            best, best_rank = (c.round, c.step), rank
    if best is None:
        return None
    meta = copies[best_rank]
    assert meta is not None
    everyone = all(c is not None and c.key == meta.key for c in copies)
    return Source(best_rank, meta, broadcast=not everyone)


# Re-forms after which survivors' workers may stay alive: a member that left,
# joined, or was lost (its process gone, or silent: frozen, partitioned). Not a
# worker failure (its cause may be in the kept state), not a store loss.
IN_PLACE_REASONS = frozenset(
    {RestartReason.MEMBER_LOST, RestartReason.MEMBER_JOINED, RestartReason.MEMBER_LEFT}
)


def keep_in_place(
    reason: RestartReason,
    silent: bool,
    running: bool,
    declared: Sequence[int | None],
    pids: Sequence[int],
    *,
    unblockable: bool = False,
) -> bool:
    """Whether the agent keeps its workers across this re-form (pure).

    Every worker must be running and have declared, under its own PID, that it
    re-forms in place (``state.TrainState(in_place=True)``): a script that did not
    opt in, or a worker started since, takes the restart path. After a silent
    loss the survivors may sit in a collective with the frozen peer that no
    socket close will end: only workers that can be unblocked (``unblockable``:
    each holds its group's links, ``memstate.unblock``) are kept then.
    """
    if reason not in IN_PLACE_REASONS or not running or not pids:
        return False
    if silent and not unblockable:
        return False
    return list(declared) == list(pids)


def unblock_kept(reason: RestartReason) -> bool:
    """Whether kept workers are told to shut their old group's links down at once (pure):
    after a loss, where a collective may wait on the lost member. Not after a join or a
    leave: those groups are whole, and their ranks leave together at a step's end
    (``reform_due``), without losing the step in flight."""
    return reason is RestartReason.MEMBER_LOST
