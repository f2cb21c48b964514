"""Typed view of an ElasticJob's ``status``: parse once, plan on values, write once.

Where it sits: beside ``spec`` at the pure layer's edge. ``JobStatus.parse``
turns the raw ``status`` (a dict from the API) into a frozen value the
planner reads and returns (``Plan.status``); the reconciler serialises it
once with ``to_manifest`` / ``to_patch`` and writes it only when it changed.
Timestamps are ``datetime`` inside and RFC 3339 strings only here
(``timestamps``).

One field is one line: the wire key is the field name in camelCase and the
codec follows the annotation (``int``, ``float``, ``str``, ``bool``,
``datetime``, an enum, a record dataclass, ``tuple[X, ...]`` for a list,
``X | None``; any other annotation is a ``TypeError`` on first use), so
adding a status field means adding its line below (and its property in the
CRD schema; a unit test ties the two together). ``None`` means the key is
absent, except in a field marked ``NULLABLE`` (written as ``null``, as the
CRD allows). Parsing is tolerant, as for objects an older operator wrote: a
missing key is ``None``, a value of the wrong shape (a bad timestamp, an
unknown phase) is read as missing, and a bad list entry is dropped; it never
raises. A status this operator wrote parses and writes back unchanged.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import types
import typing
from collections.abc import Mapping
from typing import Any, Self, TypeVar

from torchflex_operator.model.timestamps import format_time, parse_time
from torchflex_operator.model.vocabulary import ConditionType, EventType, GangScheduling, Phase

NULLABLE: Mapping[str, bool] = types.MappingProxyType({"nullable": True})
"""Field metadata: ``None`` is written as ``null`` instead of leaving the key out."""


class _BadValueError(Exception):
    """A raw value that does not fit its field (read as missing)."""


_R = TypeVar("_R", bound="Record")


def _wire_key(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


@dataclasses.dataclass(frozen=True)
class Record:
    """Base of ``JobStatus`` and its sub-values (frozen dataclasses): their wire form."""

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> Self:
        """Tolerant (see the module docstring); ``ValueError`` only when a field
        without a default is missing or bad (``JobStatus`` has none: it never raises)."""
        try:
            return _decode_record(cls, raw)
        except _BadValueError as exc:
            raise ValueError(f"not a {cls.__name__}: {raw!r}"[:300]) from exc

    def to_manifest(self) -> dict[str, Any]:
        """The wire form (JSON-ready dict; plain ``str``, not enums)."""
        out: dict[str, Any] = {}
        for name, key, _, nullable in _layout(type(self)):
            value = getattr(self, name)
            if value is None and not nullable:
                continue
            out[key] = _encode(value)
        return out


_Layout = tuple[tuple[str, str, Any, bool], ...]
_LAYOUTS: dict[type[Record], _Layout] = {}


def _layout(cls: type[Record]) -> _Layout:
    """(attribute, wire key, annotation, nullable) of each field of a record."""
    layout = _LAYOUTS.get(cls)
    if layout is None:
        hints = typing.get_type_hints(cls)
        layout = tuple(
            (f.name, _wire_key(f.name), hints[f.name], bool(f.metadata.get("nullable")))
            for f in dataclasses.fields(cls)
        )
        for name, _, hint, _ in layout:
            if not _supported(hint):  # loud, not a field that silently never parses
                raise TypeError(f"{cls.__name__}.{name}: no status codec for {hint!r}")
        _LAYOUTS[cls] = layout
    return layout


_SCALARS = (bool, int, float, str, dt.datetime)


def _supported(hint: Any) -> bool:
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        return all(a is type(None) or _supported(a) for a in args)
    if typing.get_origin(hint) is tuple:
        return len(args) == 2 and args[1] is Ellipsis and _supported(args[0])
    return hint in _SCALARS or (isinstance(hint, type) and issubclass(hint, enum.Enum | Record))


def _decode_record(cls: type[_R], raw: object) -> _R:
    if not isinstance(raw, Mapping):
        raise _BadValueError(cls.__name__)
    values: dict[str, Any] = {}
    for name, key, hint, _ in _layout(cls):
        if key not in raw:
            continue  # the dataclass default (a required field missing: invalid below)
        try:
            values[name] = _decode(hint, raw[key])
        except _BadValueError:
            continue
    try:
        return cls(**values)
    except TypeError as exc:  # a required field is missing or was invalid
        raise _BadValueError(cls.__name__) from exc


def _decode(hint: Any, raw: object) -> Any:
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        if raw is None:
            return None
        (inner,) = (a for a in typing.get_args(hint) if a is not type(None))
        return _decode(inner, raw)
    if origin is tuple:
        if not isinstance(raw, list | tuple):
            raise _BadValueError(hint)
        item = typing.get_args(hint)[0]
        out = []
        for entry in raw:
            try:
                out.append(_decode(item, entry))
            except _BadValueError:
                continue  # one bad entry does not cost the others
        return tuple(out)
    if hint is dt.datetime:
        when = parse_time(raw)
        if when is None:
            raise _BadValueError(hint)
        return when
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(raw)
        except ValueError as exc:
            raise _BadValueError(hint) from exc
    if isinstance(hint, type) and issubclass(hint, Record):
        return _decode_record(hint, raw)
    if isinstance(raw, bool) != (hint is bool):  # JSON true is no number (Python's bool is)
        raise _BadValueError(hint)
    if hint is float and isinstance(raw, int):
        return float(raw)
    if hint in _SCALARS and isinstance(raw, hint):
        return raw
    raise _BadValueError(hint)


def _encode(value: object) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dt.datetime):
        return format_time(value)
    if isinstance(value, Record):
        return value.to_manifest()
    if isinstance(value, tuple):
        return [_encode(v) for v in value]
    return value


# -- the records -----------------------------------------------------------------------


class ConditionStatus(enum.StrEnum):
    """``conditions[].status``: Kubernetes' own three values."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


@dataclasses.dataclass(frozen=True)
class Condition(Record):
    # ``type`` stays a string: a condition an operator of another version set is kept.
    type: str
    status: ConditionStatus
    reason: str = ""
    message: str = ""
    last_transition_time: dt.datetime | None = None
    observed_generation: int | None = None
    """``metadata.generation`` of the spec the latest pass weighed it against."""

    def is_type(self, ctype: ConditionType) -> bool:
        return self.type == ctype.value


@dataclasses.dataclass(frozen=True)
class WorkerException(Record):
    """The worker exception behind a failure (``lastFailure.rootCause``), as its agent
    reported it; bounded by ``torchflex_contract.progress`` (type, message, frames)."""

    type: str = ""
    message: str = ""
    frames: tuple[str, ...] = ()
    """The innermost frames, outermost first, ``file:line in function``."""
    rank: int = -1
    """Global rank of the worker that raised it."""
    round: int = -1
    pod: str = ""
    """The pod whose agent reported it (may differ from ``lastFailure.pod``)."""


@dataclasses.dataclass(frozen=True)
class RankStack(Record):
    """One rank's state when the job was declared hung (``lastFailure.stacks``)."""

    rank: int | None = None
    pod: str = ""
    steps: int | None = None
    idle_seconds: float | None = None
    waiting: bool = False
    """Its main thread was inside torch's collectives or autograd (waiting on a peer)."""
    stack: str = ""


@dataclasses.dataclass(frozen=True)
class LastFailure(Record):
    """The latest worker pod that ended unsuccessfully (``status.lastFailure``)."""

    pod: str = ""
    reason: str = ""
    """A ``Reason`` value; a string, so one another version wrote still reads."""
    exit_code: int | None = dataclasses.field(default=None, metadata=NULLABLE)
    counted: bool = False
    message: str = ""
    time: dt.datetime | None = None
    root_cause: WorkerException | None = None
    rank: int | None = None
    """Hang: the global rank that stopped taking part."""
    round: int | None = None
    """Hang: the rendezvous round that hung."""
    stacks: tuple[RankStack, ...] | None = None
    """Hang: every rank's state and main-thread stack, the one that stopped first."""


@dataclasses.dataclass(frozen=True)
class TrainingProgress(Record):
    """What the workers last reported about training (``status.progress``)."""

    step: int | None = None
    steps_per_second: float | None = None
    checkpoint_step: int | None = None
    round: int | None = None
    pod: str = ""
    """The pod whose agent's report it is."""
    last_update_time: dt.datetime | None = None
    """When the operator wrote this value (a progress-only change waits for
    ``Settings.progress_write_s`` after it)."""


@dataclasses.dataclass(frozen=True)
class LostVerdict(Record):
    """A pod some agent's report names lost, and when the operator first saw it."""

    pod: str
    round: int
    since: dt.datetime


@dataclasses.dataclass(frozen=True)
class SilentMember(Record):
    """An awaited pod of a completing job whose agent does not answer, and since when."""

    pod: str
    since: dt.datetime


@dataclasses.dataclass(frozen=True)
class HungWorker(Record):
    """A worker its agent ended because it would not exit (``status.hungWorkers``)."""

    pod: str = ""
    rank: int | None = None
    kind: str = ""
    """``Teardown`` (its work was done) or ``Completion`` (still in the script)."""
    seconds: float | None = None
    round: int | None = None
    stack: str = ""
    """Its threads' innermost stack frames as its agent captured them (bounded)."""
    time: dt.datetime | None = None


@dataclasses.dataclass(frozen=True)
class Straggler(Record):
    """A member whose workers' forwards take much longer than the others' (``stragglers``)."""

    pod: str = ""
    node: str = ""
    """The node it runs on (``spec.nodeName``)."""
    node_rank: int | None = None
    forward_seconds: float | None = None
    """Its workers' mean outermost forward pass over the agents' latest window."""
    ratio: float | None = None
    """``forward_seconds`` over the other nodes' median."""
    since: dt.datetime | None = None
    """When the operator first saw it named."""
    round: int | None = None
    """The rendezvous round the agents compared it in."""
    replaced: bool = False
    """``stragglerPolicy: Replace`` deleted it (kept while reports of that round name it,
    so a replacement under the same name is never taken for it)."""


@dataclasses.dataclass(frozen=True)
class PendingEvent(Record):
    """An Event decided and written with the status, not posted yet (``events``)."""

    id: int
    type: EventType = EventType.NORMAL
    reason: str = ""
    """An ``EventReason`` value; a string, so one an older operator decided is still posted."""
    message: str = ""


@dataclasses.dataclass(frozen=True)
class RoleStatus(Record):
    """One role of a multi-role job (``status.roles``)."""

    name: str = ""
    desired: int | None = None
    """The role's desired pods (``JobSpec.role_view``)."""
    replicas: int | None = None
    """Its worker pods that exist and are neither terminating nor finished."""
    ready: int | None = None
    world_size: int | None = None
    """Worker processes in its latest round, as its agents report it."""
    round: int | None = None
    """Its latest rendezvous round an agent reported (-1 before the first)."""


@dataclasses.dataclass(frozen=True)
class JobStatus(Record):
    """``ElasticJob.status``; docs/api.md and the CRD schema describe each field."""

    phase: Phase | None = None
    conditions: tuple[Condition, ...] | None = None
    replicas: int | None = None
    ready_replicas: int | None = None
    warm_spares: int | None = None
    updated_replicas: int | None = None
    desired_replicas: int | None = None
    selector: str | None = None
    world_size: int | None = None
    rendezvous_round: int | None = None
    restarts: int | None = None
    failures: int | None = None
    replacements: int | None = None
    last_failure: LastFailure | None = None
    stragglers: tuple[Straggler, ...] | None = None
    avoided_nodes: tuple[str, ...] | None = None
    """Nodes the job's new pods are kept off (``stragglerPolicy: Replace``), oldest first."""
    last_hang_round: int | None = None
    """The round of the latest hang recorded in ``last_failure`` (each is recorded once)."""
    start_time: dt.datetime | None = None
    completion_time: dt.datetime | None = None
    below_min_since: dt.datetime | None = None
    backoff_until: dt.datetime | None = None
    last_replacement_time: dt.datetime | None = None
    replacement_streak: int | None = None
    rendezvous_host: str | None = None
    accounted_pods: tuple[str, ...] | None = None
    observed_generation: int | None = None
    completing_since: dt.datetime | None = None
    store_unreachable_since: dt.datetime | None = None
    lost_verdicts: tuple[LostVerdict, ...] | None = None
    silent_members: tuple[SilentMember, ...] | None = None
    hung_workers: tuple[HungWorker, ...] | None = None
    event_seq: int | None = None
    pending_events: tuple[PendingEvent, ...] | None = None
    progress: TrainingProgress | None = None
    rank0_pod: str | None = None
    gang_scheduling: GangScheduling | None = None
    roles: tuple[RoleStatus, ...] | None = None
    """A multi-role job's roles, in spec order (absent for a job of one group)."""
    role_summary: str | None = None
    """``status.roles`` in a line for ``kubectl get -o wide``: ``trainer 2/2 reader 1/3``
    (ready/desired per role)."""

    def to_patch(self, old: Mapping[str, Any]) -> dict[str, Any]:
        """JSON merge patch turning the written ``old`` into this status; ``{}``: unchanged."""
        return merge_patch(old, self.to_manifest())


def wire_keys(cls: type[Record]) -> tuple[str, ...]:
    """The keys a record may write (the CRD schema must declare each)."""
    return tuple(key for _, key, _, _ in _layout(cls))


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """Merge patch turning ``old`` into ``new`` (removed keys become null)."""
    patch: dict[str, Any] = {k: v for k, v in new.items() if old.get(k) != v}
    for key in old:
        if key not in new:
            patch[key] = None
    return patch
