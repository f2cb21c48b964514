"""Training roles: the names, couplings and size ranges both sides agree on.

Where it sits: the operator's CRD and pod builder write a multi-role job's
roles as ``env.ROLE`` / ``env.COUPLING`` / ``env.ROLE_SIZES`` on each worker
pod; the agent's CLI parses them back with :func:`parse_role_sizes`. A job
without ``spec.roles`` has one role, :data:`DEFAULT_ROLE`, and none of those
variables, so its pods and spec hash are what they always were.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from typing import Final

DEFAULT_ROLE: Final = "default"
"""The role of a job without ``spec.roles`` (torchrun's ``--role`` default)."""

RESERVED_ROLE_NAMES: Final = frozenset({"store", "etcd", "workers", "worker", DEFAULT_ROLE})
"""Names a role may not take: the other pod kinds' name parts, the single-role pods'
``worker`` part and the implicit role."""

_NAME: Final = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_ROLE_NAME: Final = 20


class Coupling(enum.StrEnum):
    """How a multi-role job's roles rendezvous."""

    INDEPENDENT = "Independent"
    """Each role its own group: its own rounds, heartbeats and restart budget."""
    JOINT = "Joint"
    """One group across roles: global ranks, contiguous per role (torchrun ``--role``)."""


@dataclasses.dataclass(frozen=True)
class RoleSize:
    """One role's name and node-count range."""

    name: str
    min_nodes: int
    max_nodes: int


class RoleSizesError(ValueError):
    """A malformed ``env.ROLE_SIZES`` value (permanent: the pod spec is wrong)."""


def role_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a role's name, or None."""
    if not _NAME.match(name) or len(name) > MAX_ROLE_NAME:
        return (
            f"role name {name!r} must be a DNS label of at most {MAX_ROLE_NAME} characters "
            "(lower-case letters, digits and '-', starting with a letter)"
        )
    if name in RESERVED_ROLE_NAMES:
        return f"role name {name!r} is reserved ({', '.join(sorted(RESERVED_ROLE_NAMES))})"
    return None


def format_role_sizes(sizes: tuple[RoleSize, ...]) -> str:
    return ",".join(f"{s.name}={s.min_nodes}:{s.max_nodes}" for s in sizes)


def parse_role_sizes(text: str) -> tuple[RoleSize, ...]:
    """``trainer=2:2,reader=1:4`` -> roles in that order; raises ``RoleSizesError``."""
    out: list[RoleSize] = []
    for part in text.split(","):
        name, sep, rng = part.strip().partition("=")
        lo, sep2, hi = rng.partition(":")
        if not sep or not sep2 or not lo.isdigit() or not hi.isdigit():
            raise RoleSizesError(f"role sizes: {part!r} is not NAME=MIN:MAX (in {text!r})")
        problem = role_name_problem(name)
        if problem is not None:
            raise RoleSizesError(f"role sizes: {problem}")
        size = RoleSize(name, int(lo), int(hi))
        if not 1 <= size.min_nodes <= size.max_nodes:
            raise RoleSizesError(f"role sizes: {part!r} needs 1 <= MIN <= MAX")
        if any(s.name == name for s in out):
            raise RoleSizesError(f"role sizes: role {name!r} appears twice")
        out.append(size)
    return tuple(out)
