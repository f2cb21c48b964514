"""Typed view of a multi-role job's ``spec.roles``: each role's template, range and scope.

Where it sits: under ``model.spec`` (``JobSpec.roles``), which parses the rest of the
job; the names, couplings and the sizes string both sides agree on are the contract's
(``torchflex_contract.roles``). The CRD's CEL rules refuse what they can see; what they
cannot (a role count under a Kueue queue: CEL on a custom resource reads no labels) and
what an object written before a rule existed may hold is refused here, as
``InvalidSpecError``, which the reconciler reports as an ``InvalidSpec`` Event.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Any

from torchflex_contract.roles import role_name_problem
from torchflex_operator.model.errors import InvalidSpecError


class FailureScope(enum.StrEnum):
    """``spec.roles[].failureScope``: what one of the role's workers failing re-forms."""

    ROLE = "Role"
    """Only its own role's group (the default; under Joint coupling every role is one group)."""
    JOB = "Job"
    """Every role of the job (a parameter server whose loss leaves the others nothing to do)."""


@dataclasses.dataclass(frozen=True)
class RoleSpec:
    """One entry of ``spec.roles``."""

    name: str
    min_replicas: int
    max_replicas: int
    template: Mapping[str, Any]
    nproc_per_node: str = "auto"
    replicas: int | None = None
    """``spec.roles[].replicas``: the role's desired pods (absent: ``maxReplicas``); for
    the scale role a set ``spec.replicas`` wins."""
    failure_scope: FailureScope = FailureScope.ROLE
    warm_spares: int = 0
    """``spec.roles[].warmSpares``: the role's warm spare pods (``spec.warmSpares``'s
    meaning, per role)."""

    @property
    def elastic(self) -> bool:
        return self.min_replicas < self.max_replicas

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> RoleSpec:
        replicas = raw.get("replicas")
        return cls(
            name=str(raw["name"]),
            min_replicas=int(raw["minReplicas"]),
            max_replicas=int(raw["maxReplicas"]),
            template=raw.get("template") or {},
            nproc_per_node=str(raw.get("nprocPerNode", "auto")),
            replicas=None if replicas is None else int(replicas),
            failure_scope=FailureScope(raw.get("failureScope", FailureScope.ROLE)),
            warm_spares=int(raw.get("warmSpares", 0)),
        )


def parse_roles(raw: Sequence[Mapping[str, Any]]) -> tuple[RoleSpec, ...]:
    """``spec.roles`` in spec order; ``InvalidSpecError`` naming the field when one is
    wrong (``KeyError``/``ValueError`` of a malformed entry are the caller's to wrap)."""
    roles = tuple(RoleSpec.parse(r) for r in raw)
    if not roles:
        raise InvalidSpecError("spec.roles must hold at least one role")
    seen: set[str] = set()
    for i, role in enumerate(roles):
        problem = role_name_problem(role.name)
        if problem is not None:
            raise InvalidSpecError(f"spec.roles[{i}].name: {problem}")
        if role.name in seen:
            raise InvalidSpecError(f"spec.roles[{i}].name: role {role.name!r} appears twice")
        seen.add(role.name)
        if not 1 <= role.min_replicas <= role.max_replicas:
            raise InvalidSpecError(
                f"spec.roles[{i}]: need 1 <= minReplicas <= maxReplicas (role {role.name!r})"
            )
        if role.replicas is not None and not (
            role.min_replicas <= role.replicas <= role.max_replicas
        ):
            raise InvalidSpecError(
                f"spec.roles[{i}].replicas must be within [minReplicas, maxReplicas]"
            )
        if not 0 <= role.warm_spares <= role.max_replicas - role.min_replicas:
            raise InvalidSpecError(
                f"spec.roles[{i}].warmSpares must be within [0, maxReplicas - minReplicas]"
            )
    return roles


def check_role_refs(
    roles: Sequence[RoleSpec],
    *,
    scale_role: str | None,
    completion_role: str | None,
    queued: bool,
    joint: bool = False,
) -> None:
    """``spec.scaleRole`` and ``spec.completionRole`` name a role (and ``completionRole``
    is absent under Joint coupling, where the joint round completes the job); under a
    Kueue queue at most one role is elastic (Kueue admits one pod set with a
    ``minCount``)."""
    names = {r.name for r in roles}
    if joint and completion_role is not None:
        raise InvalidSpecError(
            "spec.completionRole is not read with coupling Joint: the joint round (every "
            "role's members) exiting 0 completes the job"
        )
    for field, value in (("spec.scaleRole", scale_role), ("spec.completionRole", completion_role)):
        if value is not None and value not in names:
            raise InvalidSpecError(
                f"{field} {value!r} names no role of spec.roles ({', '.join(sorted(names))})"
            )
    elastic = [r.name for r in roles if r.elastic]
    if queued and len(elastic) > 1:
        raise InvalidSpecError(
            "spec.roles: at most one role may be elastic (minReplicas < maxReplicas) in a "
            "job under a Kueue queue (label kueue.x-k8s.io/queue-name): Kueue admits one "
            f"elastic pod set; elastic here: {', '.join(elastic)}"
        )
