"""Unblocking a kept worker: which sockets are its process group's, and shutting only those.

The pure choice (``state_links``: addresses compared across the two ends, the
store's and older sockets left out, only connections another rank reports
from its side) is table-tested; then a real ``Unblocker`` in this process,
with real TCP connections on 127.0.0.1 and the agent's real FIFO
(``signal_unblock``): a thread blocked reading the group's link sees EOF
once the agent says its round is over, while the store's connection, an
unrelated connection and the listener are untouched. (The multi-process
behaviour with gloo, a SIGKILL and a freeze, is
``tests/integration/agent/test_state_api.py``.)
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from torchflex_agent.memstate.logic.links import (
    TcpSocket,
    candidate_links,
    endpoint,
    group_links,
    links_to,
    parse_unblock,
    unblock_line,
)
from torchflex_agent.memstate.unblock import (
    Unblocker,
    armed,
    signal_unblock,
    socket_inodes,
    tcp_sockets,
)


@pytest.mark.parametrize(
    ("host", "port", "want"),
    [
        ("127.0.0.1", 80, ("127.0.0.1", 80)),
        ("::ffff:127.0.0.1", 80, ("127.0.0.1", 80)),  # an IPv6 socket's IPv4 peer
        ("::1", 5, ("::1", 5)),
        ("fe80::1%eth0", 5, ("fe80::1", 5)),  # the scope is not part of the peer's view
        ("not-an-ip", 5, ("not-an-ip", 5)),
    ],
)
def test_endpoints_compare_across_the_two_ends(host: str, port: int, want: tuple[str, int]) -> None:
    assert endpoint(host, port) == want


A, B, C, STORE = ("10.0.0.1", 41000), ("10.0.0.2", 42000), ("10.0.0.3", 43000), ("10.0.0.9", 29500)


def sock(inode: int, local: tuple[str, int], remote: tuple[str, int] | None) -> TcpSocket:
    return TcpSocket(inode, local, remote)


@pytest.mark.parametrize(
    ("s", "before", "kept"),
    [
        (sock(1, A, B), None, True),
        (sock(2, A, None), None, False),  # a listener: gloo aborts on a shut-down one
        (sock(3, ("10.0.0.1", 50000), STORE), None, False),  # the store's connection
        (sock(4, ("10.0.0.1", STORE[1]), B), None, False),  # the store's, served here
        (sock(5, A, B), {5}, False),  # older than the group (a re-form's snapshot)
        (sock(6, A, B), {1}, True),
    ],
)
def test_candidate_links(s: TcpSocket, before: set[int] | None, kept: bool) -> None:
    assert (candidate_links([s], STORE[1], before) == [s]) is kept


def test_a_link_is_one_another_rank_reports_from_its_side() -> None:
    mine = [sock(1, A, B), sock(2, ("10.0.0.1", 41001), C), sock(3, A, ("8.8.8.8", 443))]
    rank_b = (1, [[B[0], B[1], A[0], A[1]]])  # node 1: the other end of 1
    rank_c = (2, [[C[0], C[1], "10.0.0.1", 41001], "junk", [1, 2, 3, 4], [C[0], C[1]]])
    assert group_links(mine, [rank_b, rank_c]) == {1: 1, 2: 2}  # 3 goes to no rank
    assert group_links(mine, [rank_b]) == {1: 1}
    assert group_links(mine, []) == {}
    # The same pair seen from our side only (our own row) proves nothing.
    assert group_links(mine, [(0, [s.ends() for s in mine])]) == {}


@pytest.mark.parametrize(
    ("lost", "shut"),
    [
        ({2}, {20, 21}),  # only the lost node's links: survivors' links may carry a message
        ({1, 2}, {10, 20, 21}),
        ({7}, set()),
        (None, {10, 20, 21}),  # the agent did not say: all
    ],
)
def test_only_the_lost_members_links_are_shut(lost: set[int] | None, shut: set[int]) -> None:
    assert links_to({10: 1, 20: 2, 21: 2}, lost) == shut


@pytest.mark.parametrize(
    ("line", "word"),
    [
        (unblock_line(4, [2, 1]), (4, frozenset({1, 2}))),
        (unblock_line(4, []), (4, frozenset())),  # nobody named: nothing to shut
        (b"4", (4, None)),
        (b"x 1", None),
        (b"4 1,y", None),
        (b"", None),
    ],
)
def test_the_agents_word(line: bytes, word: tuple[int, frozenset[int] | None] | None) -> None:
    assert parse_unblock(line.strip()) == word


@pytest.fixture()
def server() -> Iterator[socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as s:
        yield s


def connect(server: socket.socket) -> tuple[socket.socket, socket.socket]:
    client = socket.create_connection(server.getsockname()[:2], timeout=10)
    accepted, _ = server.accept()
    accepted.settimeout(10)
    return client, accepted


def ends_of(*socks: socket.socket) -> list[list[str | int]]:
    inodes = {os.fstat(s.fileno()).st_ino for s in socks}
    return [t.ends() for t in tcp_sockets(socket_inodes()) if t.inode in inodes]


def wait_over(watcher: Unblocker, round_no: int) -> None:
    """Until the watcher thread has read the agent's word (bounded: 10 s)."""
    pause = threading.Event()
    for _ in range(1000):
        if watcher.over >= round_no:
            return
        pause.wait(0.01)
    raise AssertionError(f"the watcher never read round {round_no}")


def test_the_agents_word_shuts_the_groups_links_and_nothing_else(
    tmp_path: Path, server: socket.socket
) -> None:
    store_client, store_side = connect(server)
    store_port = server.getsockname()[1]
    before = frozenset(socket_inodes())
    with socket.create_server(("127.0.0.1", 0)) as gloo_listener:
        link, peer_end = connect(gloo_listener)  # a link to node 1, and node 1's end of it
        kept, kept_end = connect(gloo_listener)  # a link to node 2 (a survivor)
        other, other_end = connect(gloo_listener)  # a connection to a non-rank
        watcher = Unblocker(tmp_path, 0)
        try:
            # Ranks 1 and 2 (nodes 1 and 2) report their ends of `link` and `kept`.
            def gather(mine: object) -> Sequence[object]:
                return [
                    mine,
                    {"node": 1, "links": ends_of(peer_end)},
                    {"node": 2, "links": ends_of(kept_end)},
                ]

            assert not armed(tmp_path, [os.getpid()], 3)
            got = watcher.arm(
                3, rank=0, node=0, gather=gather, store_port=store_port, existed_before=before
            )
            assert got == 2
            assert armed(tmp_path, [os.getpid()], 3)
            assert not armed(tmp_path, [os.getpid()], 4)  # another round
            assert not armed(tmp_path, [os.getpid() + 1], 3)  # another worker

            assert signal_unblock(tmp_path, 0, 2, [1])  # an older round's word: ignored
            wait_over(watcher, 2)
            peer_end.sendall(b"y")
            assert link.recv(1) == b"y"
            received: list[bytes] = []
            reader = threading.Thread(target=lambda: received.append(link.recv(1)))
            reader.start()  # blocked as a collective waits on a peer that never sends
            assert signal_unblock(tmp_path, 0, 3, [1])  # node 1 is lost
            reader.join(10)
            assert received == [b""]  # EOF: gloo's "Connection closed by peer"
            assert peer_end.recv(1) == b""  # the peer sees it too
            # Everything else still carries bytes both ways (the link to the surviving
            # node 2 too), the listener still accepts.
            for a, b in ((store_client, store_side), (other, other_end), (kept, kept_end)):
                a.sendall(b"x")
                assert b.recv(1) == b"x"
            extra, extra_end = connect(gloo_listener)
            extra.close()
            extra_end.close()
        finally:
            watcher.close()
            for s in (link, peer_end, kept, kept_end, other, other_end):
                s.close()
    store_client.close()
    store_side.close()


def test_a_word_that_came_before_the_group_was_armed_is_kept(
    tmp_path: Path, server: socket.socket
) -> None:
    link, peer_end = connect(server)
    watcher = Unblocker(tmp_path, 1)
    try:
        assert signal_unblock(tmp_path, 1, 5, [3])  # a peer died while we were re-forming
        wait_over(watcher, 5)

        def gather(mine: object) -> Sequence[object]:
            return [mine, {"node": 3, "links": ends_of(peer_end)}]

        got = watcher.arm(5, rank=0, node=0, gather=gather, store_port=1, existed_before=None)
        assert got == 1
        assert link.recv(1) == b""  # shut down as soon as armed
        assert not armed(tmp_path, [os.getpid()], 5)  # nothing left to shut: not armed
    finally:
        watcher.close()
        link.close()
        peer_end.close()


def test_nobody_listening_is_not_an_error(tmp_path: Path) -> None:
    assert not signal_unblock(tmp_path, 0, 1)  # no FIFO: the worker never opted in
    watcher = Unblocker(tmp_path, 0)
    watcher.close()
    assert watcher.join(10)
    watcher.close()  # twice: nothing written to an fd number that may be reused
    assert not signal_unblock(tmp_path, 0, 1)  # its reader is gone: nobody to tell
