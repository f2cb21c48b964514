"""The agent's worker fork server over its life: started, restarted if it died, waited for.

Where it sits: ``loop.agent.ElasticAgent`` holds one ``WarmWorkers``; ``cli``
may have started the fork server (``workers.prewarm.ForkServer``) before the
agent's own imports, and it is handed over here. Before each join the agent
lets it finish importing (bounded), so a joining node does not stop a running
group only to idle it while its own workers import torch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence

from torchflex_agent.workers.group import start_fork_server
from torchflex_agent.workers.prewarm import ForkServer

log = logging.getLogger(__name__)

WARMUP_WAIT_S = 120.0
"""Longest wait for the worker fork server's imports before joining anyway."""


class WarmWorkers:
    """The fork server, if prewarming is on and this node runs workers."""

    def __init__(
        self,
        enabled: bool,
        command: Sequence[str],
        environ: Mapping[str, str],
        fork: ForkServer | None,
    ) -> None:
        """``enabled``: ``--prewarm`` and at least one local worker; ``fork``: cli's (kept)."""
        self._enabled = enabled
        self._command = command
        self._environ = environ
        self.fork = fork

    def ensure(self) -> None:
        """A live fork server (a new one if it died); from the main thread (parent-death signal)."""
        if not self._enabled:
            return
        if self.fork is not None:
            if self.fork.alive:
                return
            log.warning("worker fork server died; starting a new one")
            self.fork.close()
            self.fork = None
        self.fork = start_fork_server(self._command, self._environ)

    def await_ready(self, stop: threading.Event) -> None:
        """Before joining, let the fork server finish importing (bounded).

        Joining a running group stops its workers; if ours were still
        importing torch, the whole group would idle until they were ready.
        Waiting here, the group trains on meanwhile.
        """
        if self.fork is None:
            return
        deadline = time.monotonic() + WARMUP_WAIT_S
        while not stop.is_set() and time.monotonic() < deadline:
            if self.fork.wait_ready(0.1) or not self.fork.alive:
                return

    def close(self) -> None:
        if self.fork is not None:
            self.fork.close()
