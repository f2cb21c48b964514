"""Unblocking a kept worker's collective: shut down its old process group's TCP links.

Where it sits: between the agent and the state API's worker side. A survivor
kept in place (``memstate.logic.copies.keep_in_place``) may sit in a collective with
the lost member: until the dead worker's own sockets close (its address
space torn down first: 44-490 ms for a torch process under load), or forever
for a frozen or partitioned one. Once the agent has decided the old group is
over it says so here (:func:`signal_unblock`, a line on a FIFO in its state
folder), and the worker's :class:`Unblocker` (a thread of
``state.TrainState(in_place=True)``, blocked on that FIFO: no polling)
shuts down (``SHUT_RDWR``) the old group's TCP connections to the lost
nodes, which ``memstate.logic.links`` picked when the group was formed. gloo reads
EOF at once, the collective raises, and the script's ``except RuntimeError:
if state.kept(): reform()`` path runs. Stdlib only, no torch: the agent
imports the agent side of it (:func:`signal_unblock`, :func:`armed`).

Only the lost members' links (``memstate.logic.links.links_to``): a link between two
survivors may be carrying a message, and gloo fails a receive cut
mid-message only at its timeout. A survivor waiting on another survivor is
released when that one leaves the group (its sockets close after whole
messages). No rank uses a collective's result that did not complete, and
every survivor resumes from the copies (``restore``), so nothing half-sent
is ever used.

A worker says when it is armed (``armed-<LOCAL_RANK>``: its PID and round):
only then may the agent keep it across a *silent* loss (a frozen peer),
which without unblocking would leave it in its collective until gloo's timeout.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import stat
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

from torchflex_agent.memstate.logic.links import (
    TcpSocket,
    candidate_links,
    endpoint,
    group_links,
    links_to,
    parse_unblock,
    unblock_line,
)

log = logging.getLogger(__name__)

Gather = Callable[[object], Sequence[object]]
"""Every rank's value, indexed by rank (a collective over the new group)."""


def fifo_path(folder: Path, local_rank: int) -> Path:
    return folder / f"unblock-{local_rank}"


def signal_unblock(
    folder: Path, local_rank: int, round_no: int, lost: Collection[int] = ()
) -> bool:
    """Agent side: tell the worker of ``local_rank`` that ``round_no``'s group is over
    and which members' nodes (``lost``: node ranks) are gone: it shuts their links.

    False when no worker listens (it exited, or never opted in): nothing to do.
    Never blocks: the FIFO is opened and written without waiting.
    """
    try:
        fd = os.open(fifo_path(folder, local_rank), os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:  # ENXIO: no reader; ENOENT: never created
        if exc.errno not in (errno.ENXIO, errno.ENOENT):
            log.warning("cannot signal worker %d to unblock: %s", local_rank, exc)
        return False
    try:
        os.write(fd, unblock_line(round_no, lost))
    except OSError as exc:
        log.warning("cannot signal worker %d to unblock: %s", local_rank, exc)
        return False
    finally:
        os.close(fd)
    return True


def armed(folder: Path, pids: Sequence[int], round_no: int) -> bool:
    """Agent side: whether every worker (``pids`` by local rank) can be unblocked in
    ``round_no`` (its ``Unblocker`` holds that round's group links)."""
    if not pids:
        return False
    for local_rank, pid in enumerate(pids):
        try:
            text = (folder / f"armed-{local_rank}").read_text().split()
            if [int(t) for t in text] != [pid, round_no]:
                return False
        except (OSError, ValueError):
            return False
    return True


def socket_inodes() -> dict[int, int]:
    """This process's sockets: inode -> fd (from ``/proc/self/fd``)."""
    out: dict[int, int] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError, ValueError):
                target = os.readlink(f"/proc/self/fd/{name}")
                if target.startswith("socket:["):
                    out[int(target[8:-1])] = int(name)
    return out


def tcp_sockets(fds: Mapping[int, int]) -> list[TcpSocket]:
    """The TCP sockets among ``fds`` (inode -> fd), each asked its two ends on a duplicate
    of its fd (``/proc/self/net/tcp`` would list the whole network namespace: tens of ms
    on a busy host)."""
    out: list[TcpSocket] = []
    for inode, fd in fds.items():
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        with sock:  # closes the duplicate only
            if sock.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            if sock.type != socket.SOCK_STREAM:
                continue
            try:
                local = endpoint(*sock.getsockname()[:2])
                remote = None
                if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                    remote = endpoint(*sock.getpeername()[:2])
            except OSError:  # not connected (ENOTCONN), or gone meanwhile
                remote = None
            out.append(TcpSocket(inode, local, remote))
    return out


def shut_down(inodes: Collection[int]) -> int:
    """``shutdown(SHUT_RDWR)`` each of this process's sockets in ``inodes``; how many.

    Each fd is duplicated and the duplicate's inode checked, so an fd number
    closed and reused meanwhile (the group being destroyed) is never touched.
    """
    done = 0
    for inode, fd in socket_inodes().items():
        if inode not in inodes:
            continue
        try:
            dup = os.dup(fd)
        except OSError:
            continue
        try:
            if os.fstat(dup).st_ino != inode:
                continue
            sock = socket.socket(fileno=dup)
            try:
                sock.shutdown(socket.SHUT_RDWR)
                done += 1
            except OSError:
                pass  # already shut down or closed by its peer
            finally:
                sock.detach()
        finally:
            os.close(dup)
    return done


class Unblocker:
    """Worker side: the current group's links, shut down when the agent says its round is over."""

    def __init__(self, folder: Path, local_rank: int) -> None:
        self._folder = folder
        self._local_rank = local_rank
        self._lock = threading.Lock()
        self._round = -1
        self._links: dict[int, int] = {}
        """The group's links: inode -> the node rank of the rank at the other end."""
        self._over = -1
        """The newest round the agent said is over (it may say so before ``arm``)..."""
        self._lost: frozenset[int] | None = None
        """...and the nodes it lost then."""
        self._closing = False
        path = fifo_path(folder, local_rank)
        with contextlib.suppress(FileExistsError):
            os.mkfifo(path, 0o600)
        if not stat.S_ISFIFO(os.stat(path).st_mode):
            raise OSError(f"{path} is not a FIFO")
        # Read-write: the FIFO always has a writer (us), so reads block instead of
        # seeing EOF between the agent's writes, and its writes never find no reader.
        self._fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._watch, name="torchflex-unblock", daemon=True)
        self._thread.start()

    def arm(
        self,
        round_no: int,
        *,
        rank: int,
        node: int,
        gather: Gather,
        store_port: int,
        existed_before: Collection[int] | None,
    ) -> int:
        """Pick ``round_no``'s group links (collective: ``gather`` over the new group) and
        say so to the agent; returns how many. ``node``: this rank's node rank
        (``GROUP_RANK``); ``existed_before``: the process's socket inodes right before
        ``init_process_group`` (None for a group formed before)."""
        mine = candidate_links(tcp_sockets(socket_inodes()), store_port, existed_before)
        rows = gather({"node": node, "links": [s.ends() for s in mine]})
        others = [
            (r["node"], r["links"])
            for i, r in enumerate(rows)
            if i != rank and isinstance(r, dict) and isinstance(r.get("node"), int)
            if isinstance(r.get("links"), list)
        ]
        links = group_links(mine, others)
        with self._lock:
            self._round, self._links = round_no, links
            over, lost = self._over >= round_no, self._lost
        if over:
            self._unblock(round_no, lost)
        elif links:
            # A torn read says "not armed": the agent then takes the restart path.
            (self._folder / f"armed-{self._local_rank}").write_text(f"{os.getpid()} {round_no}")
        return len(links)

    @property
    def over(self) -> int:
        """The newest round the agent said is over (-1: none yet)."""
        with self._lock:
            return self._over

    def join(self, timeout: float) -> bool:
        """Wait for the watcher to end (after ``close``); whether it did."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def close(self) -> None:
        """Stop the watcher (it reads a line that is not a round) and drop the links."""
        with self._lock:
            self._links = {}
            if self._closing:  # the watcher closes the fd: its number may be reused
                return
            self._closing = True
        with contextlib.suppress(OSError):
            os.write(self._fd, b"close\n")

    def _watch(self) -> None:
        pending = b""
        while True:
            try:
                chunk = os.read(self._fd, 256)
            except OSError:
                return
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line == b"close":
                    os.close(self._fd)
                    return
                word = parse_unblock(line)
                if word is not None:
                    self._unblock(*word)

    def _unblock(self, round_no: int, lost: frozenset[int] | None) -> None:
        with self._lock:
            if round_no >= self._over:
                self._over, self._lost = round_no, lost
            if self._round > round_no or not self._links:
                return  # an older round's word (its group is gone already), or nothing armed
            links = links_to(self._links, lost)
            self._links = {i: n for i, n in self._links.items() if i not in links}
        done = shut_down(links)
        log.warning(
            "round %d over: shut down %d link(s) of the process group, to node(s) %s",
            round_no,
            done,
            "all" if lost is None else sorted(lost),
        )
