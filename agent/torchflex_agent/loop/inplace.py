"""Workers kept across a re-form: the agent's side of the state API's in-place re-forming.

Where it sits: ``loop.agent.ElasticAgent`` creates the state API's folder in
``/dev/shm`` through ``InPlace.open`` for its whole life; on a re-form the
supervisor asks ``keep`` (through the agent) whether this round's workers stay
running to re-form in place (``memstate.logic.copies.keep_in_place`` decides,
``memstate.shm`` marks them kept, ``memstate.unblock`` ends a collective that
waits on a lost member), and the next round ``take``s them instead of starting
new ones.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from torchflex_agent.memstate.logic.copies import keep_in_place, unblock_kept
from torchflex_agent.memstate.shm import create_dir as create_state_dir
from torchflex_agent.memstate.shm import in_place_pids, mark_kept
from torchflex_agent.memstate.shm import remove_dir as remove_state_dir
from torchflex_agent.memstate.unblock import armed, signal_unblock
from torchflex_agent.rendezvous.logic import SILENT
from torchflex_agent.workers.group import WorkerGroup
from torchflex_agent.workers.logic import GroupState
from torchflex_contract.progress import RestartReason

log = logging.getLogger(__name__)


class InPlace:
    """The state API's folder (``memstate.shm``) and the group kept for the next round."""

    def __init__(self, terminating: threading.Event) -> None:
        self._terminating = terminating
        self.state_dir: Path | None = None
        """The state API's in-memory copies (``memstate.shm``): the agent's for its whole life."""
        self._kept: WorkerGroup | None = None
        """Workers kept across a re-form (the state API's in-place re-forming)."""

    def open(self) -> None:
        try:
            self.state_dir = create_state_dir()
        except OSError as exc:
            log.warning("no in-memory state folder (the state API keeps no copies): %s", exc)

    def keep(
        self, reason: RestartReason, lost: tuple[tuple[int, str], ...], group: WorkerGroup
    ) -> bool:
        """The supervisor asks on a re-form: keep workers that re-form in place?"""
        if self.state_dir is None or self._terminating.is_set():
            return False
        state, _ = group.poll()
        declared = in_place_pids(self.state_dir, len(group.pids))
        running = state is GroupState.RUNNING
        silent = any(how == SILENT for _rank, how in lost)
        unblockable = armed(self.state_dir, group.pids, group.round)
        if not keep_in_place(
            reason, silent, running, declared, group.pids, unblockable=unblockable
        ):
            return False
        log.info("keeping workers %s: they re-form in place", group.pids)
        for local_rank in range(len(group.pids)):
            mark_kept(self.state_dir, local_rank, group.round)
        if unblock_kept(reason):  # a collective may wait on the lost member: end it now
            nodes = [rank for rank, _how in lost]
            for local_rank in range(len(group.pids)):
                signal_unblock(self.state_dir, local_rank, group.round, nodes)
        self._kept = group
        return True

    def take(self, stop_grace: float) -> WorkerGroup | None:
        """The kept group for this round if all of it runs (else stopped: the restart path)."""
        kept, self._kept = self._kept, None
        if kept is not None and kept.poll()[0] is not GroupState.RUNNING:
            kept.stop(stop_grace)  # one exited meanwhile: the restart path
            kept = None
        return kept

    def stop_kept(self, stop_grace: float) -> None:
        """At the agent's end: stop a group still kept."""
        if self._kept is not None:
            self._kept.stop(stop_grace)
            self._kept = None

    def remove(self) -> None:
        """At the agent's end, last: remove the folder."""
        if self.state_dir is not None:
            remove_state_dir(self.state_dir)
