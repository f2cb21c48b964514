"""The roles file: every role's round and members, as the agent writes it for its workers.

Where it sits: the agent (``loop.roster``) builds one ``RoleView`` per role from
a closed round's membership (its own, or one it read under another role's
keys) and writes them with ``write_roles_file``: one JSON file per agent
(``env.ROLES_FILE`` in every worker's env), replaced atomically like the
progress file. Workers read it through ``torchflex_agent.roles`` (``peers``).
Also here: the ``env.ROLE_RANKS`` value of a Joint round (``format_role_ranks``,
``parse_role_ranks``). Stdlib only; never imports torch.

File format (JSON object)::

    {"updated": <unix time>, "coupling": "Independent", "role": "trainer",
     "roles": [{"name": "reader", "round": 4, "state": "running", "world_size": 4,
                "members": [{"rank": 0, "global_rank": 0, "node_rank": 0,
                             "host": "10.1.0.7", "port": 41234, "pod": "job-reader-0"},
                            ...]},
               ...]}

``state``: ``running`` (the round is closed and live), ``ending`` (it was marked
stale: its members are re-forming, some may be gone), ``forming`` (a new round
is open; the members listed are the last closed round's) or ``unknown`` (no
round read yet). ``port``: the worker's ``env.SERVICE_PORT`` (0: none).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torchflex_agent.rendezvous.logic import NodeDescriptor
from torchflex_contract import env as tfenv

_MAX_FILE_BYTES = 4 * 1024 * 1024


class RoleState(enum.StrEnum):
    """How current a role's listed members are (see the module docstring)."""

    RUNNING = "running"
    ENDING = "ending"
    FORMING = "forming"
    UNKNOWN = "unknown"


@dataclasses.dataclass(frozen=True)
class Peer:
    """One worker of a role: where it runs and the port it may serve on."""

    rank: int
    """Its rank within its role (``ROLE_RANK``)."""
    global_rank: int
    """Its ``RANK`` (equal to ``rank`` unless the roles are Joint)."""
    node_rank: int
    host: str
    port: int
    pod: str = ""


@dataclasses.dataclass(frozen=True)
class RoleView:
    """One role as of its latest round the agent saw."""

    name: str
    round: int
    state: RoleState
    world_size: int
    members: tuple[Peer, ...]

    @property
    def endpoints(self) -> list[tuple[str, int]]:
        """(host, port) of every member that has a service port, in role-rank order."""
        return [(p.host, p.port) for p in self.members if p.port]


def role_view(
    name: str, round_no: int, state: RoleState, nodes: Sequence[NodeDescriptor]
) -> RoleView:
    """Role ``name``'s workers in a round's membership (node order).

    ``nodes`` may hold other roles too (a Joint round): only ``name``'s are
    listed, ranked within the role as ``RendezvousResult.role_rank_offset`` does.
    A membership whose descriptors carry no role (an Independent role's own
    keys hold only that role, older agents leave it empty) counts as ``name``'s.
    """
    peers: list[Peer] = []
    global_rank = 0
    for node_rank, node in enumerate(nodes):
        if node.role in (name, ""):
            for local in range(node.nproc):
                port = node.service_ports[local] if local < len(node.service_ports) else 0
                peers.append(
                    Peer(len(peers), global_rank + local, node_rank, node.addr, port, node.pod)
                )
        global_rank += node.nproc
    return RoleView(name, round_no, state, len(peers), tuple(peers))


def unknown_role(name: str) -> RoleView:
    return RoleView(name, -1, RoleState.UNKNOWN, 0, ())


def encode_roles_file(
    views: Sequence[RoleView], *, coupling: str, role: str, updated: float
) -> bytes:
    roles = [
        {
            "name": v.name,
            "round": v.round,
            "state": v.state.value,
            "world_size": v.world_size,
            "members": [dataclasses.asdict(p) for p in v.members],
        }
        for v in views
    ]
    doc = {"updated": updated, "coupling": coupling, "role": role, "roles": roles}
    return json.dumps(doc, separators=(",", ":")).encode()


def decode_roles_file(raw: bytes) -> dict[str, RoleView]:
    """The file's roles by name; raises ``ValueError`` if it is malformed."""
    try:
        doc: Any = json.loads(raw)
        out = {}
        for r in doc["roles"]:
            members = tuple(
                Peer(
                    int(m["rank"]),
                    int(m["global_rank"]),
                    int(m["node_rank"]),
                    str(m["host"]),
                    int(m["port"]),
                    str(m.get("pod", "")),
                )
                for m in r["members"]
            )
            view = RoleView(
                str(r["name"]),
                int(r["round"]),
                RoleState(r["state"]),
                int(r["world_size"]),
                members,
            )
            out[view.name] = view
        return out
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed roles file: {exc!r}") from exc


def write_roles_file(path: Path, data: bytes) -> bool:
    """Replace the file atomically (a reader sees the old or the new one); False on error."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        return False
    return True


def read_roles_file(path: Path) -> dict[str, RoleView]:
    """What the file says ({} while the agent has written none yet)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_FILE_BYTES)
    except FileNotFoundError:
        return {}
    return decode_roles_file(raw)


def format_role_ranks(nodes: Sequence[NodeDescriptor]) -> str:
    """``env.ROLE_RANKS`` of a Joint round: ``trainer:0-3,ps:4-5`` (each role contiguous)."""
    spans: dict[str, list[int]] = {}
    rank = 0
    for node in nodes:
        span = spans.setdefault(node.role, [rank, rank - 1])
        span[1] = rank + node.nproc - 1
        rank += node.nproc
    return ",".join(f"{name}:{lo}-{hi}" for name, (lo, hi) in spans.items() if hi >= lo)


def parse_role_ranks(text: str) -> dict[str, range]:
    """``trainer:0-3,ps:4-5`` -> {"trainer": range(0, 4), "ps": range(4, 6)}."""
    out: dict[str, range] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, span = part.rpartition(":")
        lo, _, hi = span.partition("-")
        if not name or not lo.isdigit() or not hi.isdigit() or int(hi) < int(lo):
            raise ValueError(f"malformed role ranks {text!r}: {part!r} is not NAME:LO-HI")
        out[name] = range(int(lo), int(hi) + 1)
    return out


def roles_file_of(environ: Mapping[str, str]) -> Path | None:
    """The roles file a worker's env names (None outside ``torchflex-agent``)."""
    path = environ.get(tfenv.ROLES_FILE)
    return Path(path) if path else None
