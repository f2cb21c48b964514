"""The node check's store records: peers' figures, and pairing two checking nodes.

Where it sits: ``loop.preflight`` gets a ``NodeCheckRecords`` from
``Rendezvous.node_check_records`` and reads the figures of the agents that
passed before it, waits in the lobby for a peer to run its collective with
(``pair``), then publishes its own figures. Split from ``rendezvous.records``
(whose class would pass its size limit); like it, one of the modules that name
store keys (an import-linter contract in ``pyproject.toml``).

Pairing over one key, ``node-check/lobby``, written only by ``compare_set``, so
two nodes arriving together cannot both host or both claim: a node finding
another's fresh offer there claims it (it connects, rank 1); else it puts its
own offer (address, a free port, until when it waits) and polls until a claim
replaces it (it hosts, rank 0) or its wait ends, when it withdraws the offer
-- a ``compare_set`` too, so a claim landing at that instant still pairs. The
wait is short, but goes on (up to a longer bound) while other nodes are still
in their check (``node-check/started`` minus ``node-check/ended`` tickets): pods
of one job start together, but their compute halves end seconds apart.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable

from torchflex_agent.rendezvous.logic import (
    CheckOffer,
    NodeDescriptor,
    claimed_by,
    encode_claim,
    open_offer,
)
from torchflex_agent.stores.kvstore import KVStore
from torchflex_contract.store_keys import NODE_CHECKS, Keys

_POLL_S = 0.1


@dataclasses.dataclass(frozen=True)
class Pairing:
    """Two checking nodes found each other: run the collective, world size 2."""

    rank: int
    """0: this node hosts the pair's TCPStore on ``port``; 1: it connects to it."""
    host_addr: str
    port: int
    peer: str
    """The other node's pod (else node id), for the report."""


@dataclasses.dataclass(frozen=True)
class PeerFigures:
    """What the agents that passed their check before this one measured."""

    gflops: list[float]
    gbps: list[float]
    """Bus bandwidths of those that ran the collective with a peer."""


class NodeCheckRecords:
    """One node's reads and writes of the job's node-check keys, over one store connection."""

    def __init__(
        self,
        store: KVStore,
        keys: Keys,
        node: NodeDescriptor,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._keys = keys
        self._node = node
        # Wall clock, not monotonic: offers' ``until`` is compared on other nodes.
        self._clock = clock

    @property
    def _name(self) -> str:
        return self._node.pod or self._node.node_id

    def figures(self, limit: int = 64) -> PeerFigures:
        """The figures of the (at most ``limit``) latest agents that passed."""
        count = self._store.tickets(self._keys.key(NODE_CHECKS, "count"))
        keys = [self._keys.key(NODE_CHECKS, i) for i in range(max(0, count - limit), count)]
        out = PeerFigures([], [])
        for raw in self._store.get_many(keys) if keys else []:
            try:
                data = json.loads(raw or b"")
                out.gflops.append(float(data["gflops"]))
                if data.get("gbps") is not None:
                    out.gbps.append(float(data["gbps"]))
            except (ValueError, TypeError, KeyError, AttributeError):
                continue
        return out

    def publish(self, gflops: float, gbps: float | None) -> None:
        """This agent passed with ``gflops`` (and ``gbps``, if it had a peer)."""
        index = self._store.take_ticket(self._keys.key(NODE_CHECKS, "count")) - 1
        raw = json.dumps({"node": self._node.node_id, "gflops": gflops, "gbps": gbps})
        self._store.set(self._keys.key(NODE_CHECKS, index), raw.encode())

    def begin(self) -> None:
        """This node starts its check: those waiting for a peer wait for it too."""
        self._store.take_ticket(self._keys.key(NODE_CHECKS, "started"))

    def end(self) -> None:
        """This node's check is over (passed or failed)."""
        self._store.take_ticket(self._keys.key(NODE_CHECKS, "ended"))

    def _others_checking(self) -> bool:
        started = self._store.tickets(self._keys.key(NODE_CHECKS, "started"))
        return started - self._store.tickets(self._keys.key(NODE_CHECKS, "ended")) > 1

    def pair(self, port: int, wait_s: float, max_wait_s: float) -> Pairing | None:
        """Find a node checking at the same time; None if none came.

        ``port``: a free port on this node's address, where its check program
        hosts the pair's store if this node ends up waiting (rank 0). Waits
        ``wait_s``, or up to ``max_wait_s`` while other nodes are still in
        their check (between ``begin`` and ``end``).
        """
        lobby = self._keys.key(NODE_CHECKS, "lobby")
        me = self._node.node_id
        start = self._clock()
        deadline, until = start + wait_s, start + max(wait_s, max_wait_s)
        while True:
            raw = self._store.get(lobby)
            offer = open_offer(raw, me, self._clock())
            if offer is not None:
                claim = encode_claim(offer, me, self._name)
                if self._store.compare_set(lobby, raw, claim) == claim:
                    return Pairing(1, offer.addr, offer.port, offer.name)
            else:
                mine = CheckOffer(me, self._name, self._node.addr, port, until).encode()
                if self._store.compare_set(lobby, raw, mine) == mine:
                    return self._wait_for_claim(lobby, mine, port, (deadline, until))
            if self._clock() >= deadline:
                return None

    def _wait_for_claim(
        self, lobby: str, mine: bytes, port: int, ends: tuple[float, float]
    ) -> Pairing | None:
        deadline, until = ends
        raw: bytes | None = mine
        while raw == mine:
            now = self._clock()
            if now >= until or (now >= deadline and not self._others_checking()):
                break
            time.sleep(_POLL_S)
            raw = self._store.get(lobby)
        if raw == mine:
            withdrawn = json.dumps({"withdrawn": self._node.node_id}).encode()
            raw = self._store.compare_set(lobby, mine, withdrawn)
        peer = claimed_by(raw, self._node.node_id)
        return None if peer is None else Pairing(0, self._node.addr, port, peer)
