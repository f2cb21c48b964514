"""This node as the rendezvous sees it: its descriptor, and the master store it offers.

Where it sits: ``loop.agent.ElasticAgent`` asks ``Node.descriptor`` before each
join: a fresh master store (``stores.tcp.MasterStore``, the workers' TCPStore
if this node becomes node rank 0) listening on the port the descriptor
publishes, or a free port for the workers' rank 0 to host their own; and tells
``joined`` the round it got (a node that is not rank 0 closes its master store;
the rank it had is published in the next descriptor).
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING

from torchflex_agent.errors import StoreUnavailableError
from torchflex_agent.loop.logic.config import AgentConfig
from torchflex_agent.rendezvous.logic import NodeDescriptor, RendezvousResult
from torchflex_contract import env as tfenv

if TYPE_CHECKING:
    from torchflex_agent.stores.tcp import MasterStore

log = logging.getLogger(__name__)


def free_port() -> int:
    """A currently free TCP port; the master binds it shortly after (torchrun does the same)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


class Node:
    """The node's identity, its last node rank and the master store it offers."""

    def __init__(
        self, config: AgentConfig, nproc: int, environ: Mapping[str, str], node_id: str | None
    ) -> None:
        self._config = config
        self._nproc = nproc
        self._pod_name = environ.get(tfenv.POD_NAME, "")
        self.node_id = node_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._prev_rank = -1
        self._master_store: MasterStore | None = None
        # Picked once, not per round: a worker kept across a re-form (in place) goes
        # on serving on its port, and the roles file must keep naming it.
        self.service_ports = tuple(free_port() for _ in range(nproc))

    def bare(self) -> NodeDescriptor:
        """A descriptor that offers nothing (to mark the job failed before any round)."""
        return NodeDescriptor(
            self.node_id, self._config.node_addr, 0, self._nproc, role=self._config.role
        )

    def descriptor(self, watch: int) -> NodeDescriptor:
        """Our descriptor for the next round, with a fresh master store listening on its port.

        ``watch``: the presence server's port (0: none).
        """
        self.close_master_store()
        port, agent_store = 0, False
        try:
            # Imported here: it loads torch, which etcd-only agents may not need before.
            from torchflex_agent.stores.tcp import MasterStore

            master = MasterStore()
            self._master_store = master
            port, agent_store = master.port, True
        except (StoreUnavailableError, ImportError) as exc:
            log.warning("workers' rank 0 will host their store: %s", exc)
            port = free_port()
        return NodeDescriptor(
            self.node_id,
            self._config.node_addr,
            port,
            self._nproc,
            watch,
            self._prev_rank,
            agent_store,
            self._pod_name,
            self._config.role,
            self.service_ports,
        )

    def joined(self, result: RendezvousResult) -> None:
        """A round closed with us in it: remember our rank; only node rank 0's store is used."""
        self._prev_rank = result.node_rank
        if result.node_rank != 0:
            self.close_master_store()

    def close_master_store(self) -> None:
        if self._master_store is not None:
            self._master_store.close()
            self._master_store = None
