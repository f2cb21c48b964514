"""The agent's store session (``torchflex_agent.loop.session``): one reconnect path.

Where it sits: unit tests over the in-memory store; the agent's loop calls
``StoreSession.reconnect`` whenever the store was lost (during a rendezvous or
while a round ran), and these check what that one path does: the lost
connection closed, a new one opened, a new ``Rendezvous`` for the same node, the
report's ``store_error`` set when lost and cleared when the store answers.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from torchflex_agent.loop.connecting import Connect
from torchflex_agent.loop.logic.config import parse_args
from torchflex_agent.loop.session import StoreSession
from torchflex_agent.loop.supervise import AgentExitError
from torchflex_agent.rendezvous.logic import NodeDescriptor, RendezvousSettings
from torchflex_agent.stores.kvstore import MemoryStore
from torchflex_contract.exit_codes import ExitCode

NODE = NodeDescriptor("node-a", "127.0.0.1", 0, 1)
SETTINGS = RendezvousSettings(1, 1, 0.0, 5.0, 5.0)


class Connections:
    """Opens ``MemoryStore`` connections to one store, remembering each and its closing."""

    def __init__(self) -> None:
        self.base = MemoryStore()
        self.opened: list[MemoryStore] = []
        self.closed: list[MemoryStore] = []

    def __call__(self, deadline: float) -> MemoryStore:
        conn = self.base.clone()
        conn.close = lambda: self.closed.append(conn)  # type: ignore[method-assign]
        self.opened.append(conn)
        return conn


def _session(
    connect: Connect, stop: threading.Event | None = None
) -> tuple[StoreSession, list[dict[str, Any]]]:
    config = parse_args(
        ["--rdzv-backend", "memory", "--rdzv-id", "job", "--", "python", "-c", "pass"], env={}
    )
    updates: list[dict[str, Any]] = []
    session = StoreSession(
        config, connect, SETTINGS, stop or threading.Event(), lambda **kw: updates.append(kw)
    )
    return session, updates


def test_start_opens_the_store_then_asks_for_the_node() -> None:
    connect = Connections()
    asked: list[int] = []

    def node() -> NodeDescriptor:
        asked.append(len(connect.opened))
        return NODE

    session, updates = _session(connect)
    rdzv = session.start(node)
    assert asked == [1]  # the descriptor is made once the store answers
    assert session.rdzv is rdzv and rdzv.node == NODE
    assert updates == [{"store_error": ""}]


def test_reconnect_closes_the_lost_connection_and_rejoins_as_the_same_node() -> None:
    connect = Connections()
    session, updates = _session(connect)
    first = session.start(lambda: NODE)
    first.node = NodeDescriptor("node-a", "127.0.0.1", 4242, 1, prev_rank=0)
    session.lost("while running", RuntimeError("gone"))
    second = session.reconnect()
    assert connect.closed == [connect.opened[0]] and len(connect.opened) == 2
    assert second is session.rdzv and second is not first
    assert second.node == first.node
    assert updates[-2:] == [{"store_error": "gone"}, {"store_error": ""}]


def test_sigterm_while_connecting_is_exit_75() -> None:
    stop = threading.Event()
    stop.set()

    def never(deadline: float) -> MemoryStore:
        threading.Event().wait(max(0.0, deadline - time.monotonic()))
        raise AssertionError("not reached")

    session, _ = _session(never, stop)
    with pytest.raises(AgentExitError) as exc:
        session.open("startup", timeout=5.0)
    assert exc.value.code is ExitCode.PREEMPTED
