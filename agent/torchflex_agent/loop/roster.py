"""Keeps the agent's roles file current: every role's round, world size and members.

Where it sits: ``loop.agent.ElasticAgent`` owns one ``Roster`` and calls
``round_started`` each time its workers are about to run a round; the file's
format and its atomic write are ``workers.roster``'s, and workers read it with
``torchflex_agent.roles``. What it lists:

- a single-role job, or a Joint one (one round across roles): the round this
  agent is in, written at round start. Its workers' round is the file's round;
  nothing else can change without this agent re-forming, so no store reads.
- a role of an Independent job (``--role-sizes`` names the job's roles): its own
  round as above, and every other role's newest round, read under that role's
  keys by a thread every ``REFRESH_S`` (``RoundRecords.peek_round``: one read
  per role while its round stays the same) over a store connection of its own,
  so a trainer sees readers come and go without any round of its own changing.
- failure scope Job (``--job-scoped-roles``): the same reads tell when a Job-scoped
  role's round ended for anything but growth (``loop.logic.scope``); the thread then
  marks this agent's own round stale with ``RestartReason.ROLE_FAILED``, and every
  member of this role re-forms (the first mark wins: one per round).

Best effort: a store that does not answer leaves the file as it was (the loop
has its own reaction to a lost store); the thread retries on the next tick.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from pathlib import Path

from torchflex_agent.errors import RendezvousError
from torchflex_agent.loop.logic import scope
from torchflex_agent.loop.logic.config import AgentConfig, role_key_id
from torchflex_agent.rendezvous.logic import RendezvousResult, RoundPeek
from torchflex_agent.rendezvous.protocol import Rendezvous
from torchflex_agent.rendezvous.records import RoundRecords
from torchflex_agent.workers.roster import (
    RoleState,
    RoleView,
    encode_roles_file,
    role_view,
    unknown_role,
    write_roles_file,
)
from torchflex_contract.progress import RestartReason
from torchflex_contract.roles import Coupling

log = logging.getLogger(__name__)

REFRESH_S = 1.0
"""How often an Independent role's agent reads the other roles' rounds."""


def peek_view(name: str, peek: RoundPeek) -> RoleView:
    """A role's view from an onlooker's read of its newest round."""
    if peek.nodes is None:
        state = RoleState.FORMING if peek.round >= 0 else RoleState.UNKNOWN
        return RoleView(name, peek.round, state, 0, ())
    state = RoleState.RUNNING
    if peek.forming:
        state = RoleState.FORMING
    elif peek.stale:
        state = RoleState.ENDING
    return role_view(name, peek.round, state, peek.nodes)


def next_guess(peek: RoundPeek) -> int:
    """The round to read first next time (``RoundRecords.peek_round`` steps on from it)."""
    return max(peek.round, 0)


class Roster:
    """The agent's roles file and, for an Independent role, the thread keeping it current."""

    def __init__(self, config: AgentConfig, path: Path) -> None:
        self.path = path
        self._config = config
        self._names = [s.name for s in config.role_sizes] or [config.role]
        self._joint = bool(config.role_sizes) and config.coupling is Coupling.JOINT
        self._watch = bool(config.role_sizes) and not self._joint
        self._lock = threading.Lock()
        self._views = {name: unknown_role(name) for name in self._names}
        self._written: tuple[RoleView, ...] | None = None
        self._rdzv: Rendezvous | None = None
        self._round = -1
        self._scoped = [n for n in config.job_scoped_roles if n != config.role]
        self._watches: dict[str, scope.ScopeWatch] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def joint(self) -> bool:
        """One round across every role (``--coupling Joint`` with ``--role-sizes``)."""
        return self._joint

    def round_started(self, rdzv: Rendezvous, result: RendezvousResult) -> None:
        """Our round closed: list it now (before any worker starts), then keep it current."""
        own = [self._config.role] if not self._joint else self._names
        with self._lock:
            for name in own:
                self._views[name] = role_view(name, result.round, RoleState.RUNNING, result.nodes)
            self._rdzv = rdzv
            self._round = result.round
        self._write()
        if self._watch and self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True, name="roster")
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)

    def _write(self) -> None:
        with self._lock:
            views = tuple(self._views[name] for name in self._names)
            if views == self._written:
                return
            data = encode_roles_file(
                views, coupling=self._config.coupling.value, role=self._config.role,
                updated=time.time(),
            )  # fmt: skip
            if write_roles_file(self.path, data):
                self._written = views

    def _run(self) -> None:
        conn: Rendezvous | None = None
        guesses = dict.fromkeys(self._names, 0)
        while not self._stop.wait(REFRESH_S):
            try:
                if conn is None:
                    with self._lock:
                        source = self._rdzv
                    if source is None:
                        continue
                    conn = source.clone()
                self._refresh(conn, guesses)
            except (RendezvousError, OSError, ValueError) as exc:
                log.debug("roles file not refreshed: %s", exc)
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
                conn = None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _refresh(self, conn: Rendezvous, guesses: dict[str, int]) -> None:
        for name in self._names:
            if name == self._config.role:
                continue  # our own role: listed at each round start, when it changes
            records = conn.for_run(role_key_id(self._config.run_id, name, Coupling.INDEPENDENT))
            peek = records.peek_round(guesses[name])
            guesses[name] = next_guess(peek)
            with self._lock:
                self._views[name] = peek_view(name, peek)
            if name in self._scoped:
                self._judge(conn, name, records, peek)
        self._write()

    def _judge(self, conn: Rendezvous, name: str, records: RoundRecords, peek: RoundPeek) -> None:
        """Failure scope Job: end our own round if role ``name``'s ended for a failure."""
        formed = peek.nodes is not None
        watch = self._watches.get(name)
        if watch is None:
            self._watches[name] = scope.first_sight(peek.round, formed, peek.stale)
            return
        wanted = scope.to_read(watch, peek.round, formed, peek.stale)
        marks = {k: records.stale_mark(k) for k in wanted}
        self._watches[name], ended = scope.judge(watch, peek.round, formed, peek.stale, marks)
        with self._lock:
            own = self._round
        if ended is None or own < 0:
            return
        detail = ended.describe(name)
        mine = conn.for_run(self._config.rdzv_key_id)
        got = mine.mark_stale(own, RestartReason.ROLE_FAILED, detail)
        log.warning("round %d: %s; re-forming role %s (%s)", own, detail, self._config.role,
                    got.reason.value)  # fmt: skip
