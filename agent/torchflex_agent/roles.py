"""Finding the other roles of a multi-role job: a helper for training scripts.

Where it sits: imported by training scripts only, like ``state`` and
``progress``; it reads the roles file the agent keeps current
(``env.ROLES_FILE``, written by ``loop.roster``, format in ``workers.roster``)
and, for Joint jobs, the role ranks (``env.ROLE_RANKS``). Importing it does
not import torch; only ``role_group`` does, when called. In a script::

    from torchflex_agent import roles

    for peer in roles.peers("reader"):        # every reader worker, in role-rank order
        connect(peer.host, peer.port)          # the port it serves on (TORCHFLEX_SERVICE_PORT)
    view = roles.role("reader")                # round, state, world size, members

    trainers = roles.role_group("trainer")     # Joint: a process group of the trainers

``peers`` is the RFC's ``get_role_info`` without RPC: each call reads the file
again (a few KiB), so a client that lost a peer calls it to learn who serves
now. A worker serves on its own ``service_port()``; a peer listed may be gone
already (its role is re-forming: ``state`` is not ``running``): skip it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from torchflex_agent.workers.roster import (
    Peer,
    RoleState,
    RoleView,
    parse_role_ranks,
    read_roles_file,
    roles_file_of,
)
from torchflex_contract import env as tfenv

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = [
    "Peer",
    "RoleState",
    "RoleView",
    "peers",
    "role",
    "role_group",
    "role_ranks",
    "roles",
    "service_port",
]


def roles(environ: Mapping[str, str] | None = None) -> dict[str, RoleView]:
    """Every role of the job as the agent last wrote it; {} outside ``torchflex-agent``."""
    path = roles_file_of(os.environ if environ is None else environ)
    return read_roles_file(path) if path is not None else {}


def role(name: str, environ: Mapping[str, str] | None = None) -> RoleView | None:
    """Role ``name``'s round, state, world size and members (None: no such role)."""
    return roles(environ).get(name)


def peers(name: str, environ: Mapping[str, str] | None = None) -> list[Peer]:
    """Role ``name``'s workers (host, service port, ranks), in role-rank order."""
    view = role(name, environ)
    return list(view.members) if view is not None else []


def service_port(environ: Mapping[str, str] | None = None) -> int:
    """The port this worker may serve on (0 outside ``torchflex-agent``)."""
    env = os.environ if environ is None else environ
    return int(env.get(tfenv.SERVICE_PORT, "0") or "0")


def role_ranks(environ: Mapping[str, str] | None = None) -> dict[str, range]:
    """Joint jobs: every role's global ranks (``TORCHFLEX_ROLE_RANKS``); {} otherwise."""
    env = os.environ if environ is None else environ
    return parse_role_ranks(env.get(tfenv.ROLE_RANKS, ""))


def role_group(name: str, **kwargs: Any) -> ProcessGroup:
    """Joint jobs: the process group of role ``name``'s ranks (``dist.new_group``).

    Collective: the first call creates one group per role, in the order of
    ``TORCHFLEX_ROLE_RANKS``, on every rank, so every rank must make its first
    call at the same point of the script (after ``init_process_group``), as
    with ``new_group`` itself; later calls return the groups made then.
    ``kwargs`` (e.g. ``backend``) go to every ``new_group`` of that first call.
    """
    groups = _groups(tuple(sorted(kwargs.items())))
    if name not in groups:
        raise KeyError(f"no role {name!r} in {tfenv.ROLE_RANKS} ({', '.join(groups) or 'unset'})")
    return groups[name]


@functools.cache
def _groups(kwargs: tuple[tuple[str, Any], ...]) -> dict[str, ProcessGroup]:
    import torch.distributed as dist

    ranks = role_ranks()
    if not ranks:
        raise RuntimeError(f"{tfenv.ROLE_RANKS} is unset: role groups need a Joint job")
    return {name: dist.new_group(list(span), **dict(kwargs)) for name, span in ranks.items()}
