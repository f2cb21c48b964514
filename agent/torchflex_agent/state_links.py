"""Pure decisions of in-place unblocking: which TCP sockets are a process group's links.

Where it sits: a kept survivor (``state.TrainState(in_place=True)``) whose
collective waits on a lost peer is unblocked by shutting down the old process
group's TCP connections (``state_unblock`` does the I/O: lists
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
from collections.abc import Collection, Iterable, Sequence

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


def group_links(mine: Sequence[TcpSocket], others: Iterable[Sequence[object]]) -> frozenset[int]:
    """The inodes of ``mine`` that another rank reports as its end of the same connection.

    ``others``: every other rank's candidates as gathered (``TcpSocket.ends``);
    malformed rows are ignored (a rank that found none sends an empty list).
    """
    seen = {ends for rows in others for row in rows if (ends := _ends(row)) is not None}
    return frozenset(s.inode for s in mine if (s.remote, s.local) in seen)


def _ends(row: object) -> tuple[Endpoint, Endpoint] | None:
    if not isinstance(row, list | tuple) or len(row) != 4:
        return None
    la, lp, ra, rp = row
    if not (isinstance(la, str) and isinstance(ra, str)):
        return None
    if not (isinstance(lp, int) and isinstance(rp, int)):
        return None
    return (la, lp), (ra, rp)
