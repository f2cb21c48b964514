"""Pure decisions of in-place unblocking: which TCP sockets are a process group's links.

Where it sits: a kept survivor (``state.TrainState(in_place=True)``) whose
collective waits on a lost peer is unblocked by shutting down the old process
group's TCP connections (``memstate.unblock`` does the I/O: lists
``/proc/self/fd``, asks each socket its two ends, gathers, shuts down). This
module decides, from those ends and the gathered ones, which of the
worker's sockets those are, and only those: never the c10d store's
connection (it lives on across the re-form, and a store shared with the agent
must not see an EOF), never a listener (gloo's accept loop aborts the
process on a shut-down listener: measured, torch 2.13), never a socket the
script opened itself. Held to the agent's pure import-linter contract.

The rule, from what gloo's TCP transport does (full mesh, one connection per
pair of ranks, made during ``init_process_group``): a group link is a
connected TCP socket of this process, created since the group's
``init_process_group`` began (when known: a re-form snapshots the process's
sockets right before it), not to or from the store's port, whose two
endpoints are a connection *another rank of the same group* reports from its
side (its local endpoint is our remote one and the reverse). So a
connection to a data server, a metrics endpoint or the store is never
chosen; for the first group (created before the state API could look) a
TCP connection the script itself opened between two of its ranks would be,
which is the one case the re-form's snapshot rules out.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Collection, Iterable, Mapping, Sequence

Endpoint = tuple[str, int]
"""An address as text (IPv4-mapped IPv6 written as IPv4, as the peer may see it) and a port."""


def endpoint(host: str, port: int) -> Endpoint:
    """``getsockname``/``getpeername``'s address, comparable across the two ends: an
    IPv6 socket reports an IPv4 peer as ``::ffff:a.b.c.d``, which its peer calls ``a.b.c.d``."""
    try:
        ip = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return host, port
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped), port
    return str(ip), port


@dataclasses.dataclass(frozen=True)
class TcpSocket:
    """One TCP socket of the process, as ``getsockname``/``getpeername`` see it."""

    inode: int
    local: Endpoint
    remote: Endpoint | None
    """None for a listener or a socket not connected."""

    def ends(self) -> list[str | int]:
        """How it is gathered (JSON): local address, port, remote address, port."""
        remote = self.remote or ("", 0)
        return [self.local[0], self.local[1], remote[0], remote[1]]


def candidate_links(
    sockets: Iterable[TcpSocket], store_port: int, existed_before: Collection[int] | None
) -> list[TcpSocket]:
    """This process's TCP sockets that may be the group's: connected (no listener), not
    the store's port at either end, and not older than the group when that is known."""
    out = []
    for s in sockets:
        if s.remote is None or store_port in (s.local[1], s.remote[1]):
            continue
        if existed_before is not None and s.inode in existed_before:
            continue
        out.append(s)
    return out


def group_links(
    mine: Sequence[TcpSocket], others: Iterable[tuple[int, Sequence[object]]]
) -> dict[int, int]:
    """The inodes of ``mine`` that another rank reports as its end of the same
    connection, each with that rank's node rank (its agent's, ``GROUP_RANK``).

    ``others``: every other rank's node rank and candidates as gathered
    (``TcpSocket.ends``); malformed rows are ignored (a rank that found none
    sends an empty list).
    """
    seen: dict[tuple[Endpoint, Endpoint], int] = {}
    for node, rows in others:
        for row in rows:
            ends = _ends(row)
            if ends is not None:
                seen[ends] = node
    out: dict[int, int] = {}
    for s in mine:
        peer = seen.get((s.remote, s.local)) if s.remote is not None else None
        if peer is not None:
            out[s.inode] = peer
    return out


def links_to(links: Mapping[int, int], lost: Collection[int] | None) -> frozenset[int]:
    """The links to shut down after the loss of the nodes ``lost`` (None: unknown, all).

    Only the lost members' links: a link between two survivors may be
    carrying a message right then, and gloo does not fail a receive cut
    mid-message (it waits for its timeout); a survivor waiting on another
    survivor is released when that one leaves the group and its sockets
    close, with whole messages only.
    """
    return frozenset(i for i, node in links.items() if lost is None or node in lost)


def unblock_line(round_no: int, lost: Collection[int]) -> bytes:
    """The agent's word to a kept worker: ``round_no`` is over, the nodes ``lost`` are gone."""
    nodes = ",".join(str(n) for n in sorted(lost)) or "-"  # "-": nobody, nothing to shut
    return f"{round_no} {nodes}\n".encode()


def parse_unblock(line: bytes) -> tuple[int, frozenset[int] | None] | None:
    """:func:`unblock_line`'s round and lost nodes (None: not said: all); None if malformed."""
    parts = line.split()
    try:
        round_no = int(parts[0])
        if len(parts) < 2:
            return round_no, None
        if parts[1] == b"-":
            return round_no, frozenset()
        return round_no, frozenset(int(n) for n in parts[1].split(b","))
    except (IndexError, ValueError):
        return None


def _ends(row: object) -> tuple[Endpoint, Endpoint] | None:
    if not isinstance(row, list | tuple) or len(row) != 4:
        return None
    la, lp, ra, rp = row
    if not (isinstance(la, str) and isinstance(ra, str)):
        return None
    if not (isinstance(lp, int) and isinstance(rp, int)):
        return None
    return (la, lp), (ra, rp)
