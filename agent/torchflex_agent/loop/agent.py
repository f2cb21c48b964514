"""The agent loop: rendezvous, run the worker group, react, repeat.

Where it sits: at the top of ``loop``; ``cli`` builds an ``ElasticAgent`` from
the config and calls ``run()``, whose return value is the process exit code
(``torchflex_contract.exit_codes.ExitCode``). States (``AgentState``)::

    Init -> Rendezvous -> Running -> (Restarting -> Rendezvous)* -> Succeeded
                                  \\-> Leaving (SIGTERM, exit 75)
                                  \\-> Failed (restart budget spent, exit 1)

A warm spare (``loop.standby``) stays in Init, store open, until it is promoted.

This module does the I/O of the loop: rendezvous calls, worker launch, reports.
The store connection and its reconnect are ``loop.session``'s; the workers kept
across a re-form, ``loop.inplace``'s. Once a round's workers run,
``loop.supervise`` watches them and acts on what ``loop.logic.policy`` decides
(failures, fencing, leave).

Things that make a re-formed group train again fast, all started here:
the presence server (peers see this process die at once, ``rendezvous.liveness``),
the fork server (workers start without importing torch, ``workers.prewarm``), and
the expected size of the next round (no last call when the survivors are
all there, ``rendezvous.logic.expected_next``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torchflex_agent.errors import (
    CommandNotRunnableError,
    JobFailedError,
    LaunchError,
    PermanentError,
    RendezvousClosedError,
    RendezvousTimeoutError,
    StoreUnavailableError,
)
from torchflex_agent.fence import Lease, lease_duration
from torchflex_agent.loop.connecting import Connect
from torchflex_agent.loop.health import ReportBoard, write_termination_log
from torchflex_agent.loop.inplace import InPlace
from torchflex_agent.loop.logic.config import AgentConfig, rendezvous_settings
from torchflex_agent.loop.logic.policy import closed_job_exit
from torchflex_agent.loop.node import Node
from torchflex_agent.loop.preflight import check_interpreter, check_node
from torchflex_agent.loop.roster import Roster
from torchflex_agent.loop.session import StoreSession
from torchflex_agent.loop.standby import stand_by
from torchflex_agent.loop.supervise import (
    STORE_LOST_STOP_GRACE_S,
    AgentExitError,
    RoundSupervisor,
    fail_job,
)
from torchflex_agent.loop.warm import WarmWorkers
from torchflex_agent.memstate.shm import hand_round
from torchflex_agent.progress import read_progress
from torchflex_agent.rendezvous.liveness import LivenessSettings, PresenceServer, RoundMonitor
from torchflex_agent.rendezvous.logic import (
    NodeDescriptor,
    RendezvousResult,
    expected_next,
)
from torchflex_agent.rendezvous.protocol import Rendezvous, RendezvousInterruptedError
from torchflex_agent.workers.group import (
    LaunchContext,
    WorkerGroup,
    command_problem,
    progress_file,
)
from torchflex_agent.workers.prewarm import ForkServer
from torchflex_contract.exit_codes import ExitCode
from torchflex_contract.progress import AgentReport, AgentState, RestartReason

log = logging.getLogger(__name__)

# Longest an agent with an unrunnable command tries to reach the store to
# mark the job failed before it exits anyway.
MARK_FAILED_CONNECT_S = 5.0


class ElasticAgent:
    def __init__(
        self,
        config: AgentConfig,
        connect: Connect,
        nproc: int,
        environ: Mapping[str, str],
        node_id: str | None = None,
        *,
        fork: ForkServer | None = None,
    ) -> None:
        """``fork``: the fork server ``cli`` started before importing this module (kept)."""
        self.config = config
        self._nproc = nproc
        self._environ = dict(environ)
        self._node = Node(config, nproc, self._environ, node_id)
        self.node_id = self._node.node_id
        self._terminating = threading.Event()
        self._wake = threading.Event()
        self._board = ReportBoard(AgentReport(state=AgentState.INIT))
        self._error_dir = Path(tempfile.mkdtemp(prefix="torchflex-errors-"))
        self._settings = rendezvous_settings(config)
        self._session = StoreSession(
            config, connect, self._settings, self._terminating, self._update
        )
        self._liveness = LivenessSettings(config.heartbeat_interval, config.liveness_timeout)
        self._lease = Lease(
            self._error_dir / "lease",
            lease_duration(config.heartbeat_interval, config.liveness_timeout),
        )
        self._presence: PresenceServer | None = None
        self._warm = WarmWorkers(config.prewarm and nproc >= 1, config.command, self._environ, fork)
        self._roster = Roster(config, self._error_dir / "roles.json")
        self._inplace = InPlace(self._terminating)
        self._restarts_seen = 0
        """Highest job-wide restart count seen: republished if the store forgot it."""
        self._supervisor = RoundSupervisor(
            config,
            self.node_id,
            self._liveness,
            self._lease,
            self._wake,
            self._terminating,
            self._update,
            self._counted,
            self._inplace.keep,
        )

    # -- reporting ------------------------------------------------------

    def report(self) -> AgentReport:
        """The current report, with what the workers last reported about training."""
        return self._with_progress(self._board.get())

    def wait_round(self, after: int, timeout: float) -> AgentReport:
        """The report once the round is not ``after`` (or the agent ends), at most ``timeout``."""
        return self._with_progress(self._board.wait_round(after, timeout))

    def _with_progress(self, report: AgentReport) -> AgentReport:
        # Read per request (a few hundred bytes): the workers write it, not us.
        progress = read_progress(progress_file(self._error_dir))
        return dataclasses.replace(report, progress=progress) if progress else report

    def _update(self, **changes: Any) -> None:
        self._board.replace(lambda report: dataclasses.replace(report, **changes))

    def _counted(self, restarts: int) -> None:
        """This agent counted a worker failure: the job-wide count is now ``restarts``."""
        self._restarts_seen = max(self._restarts_seen, restarts)
        self._update(restarts=restarts)

    # -- control --------------------------------------------------------

    def request_stop(self) -> None:
        """SIGTERM: safe to call from a signal handler."""
        self._terminating.set()
        self._wake.set()

    def run(self) -> int:
        try:
            self._check_command()
            self._start_helpers()
            code, message = self._run(), ""
        except AgentExitError as exc:
            code, message = exc.code, exc.message
        finally:
            self._stop_helpers()
        state = {
            ExitCode.SUCCESS: AgentState.SUCCEEDED,
            ExitCode.PREEMPTED: AgentState.LEAVING,
            ExitCode.RENDEZVOUS_CLOSED: AgentState.SUCCEEDED,
        }.get(code, AgentState.FAILED)
        if message:
            log.error("%s", message)
        self._update(state=state, message=message or self.report().message)
        write_termination_log(self.report(), self._environ)
        return int(code)

    def _start_helpers(self) -> None:
        """Presence server and fork server; from the main thread (parent-death signal)."""
        try:
            self._presence = PresenceServer()
        except OSError as exc:
            log.warning("no presence server (peers fall back to heartbeats): %s", exc)
        self._inplace.open()
        self._warm.ensure()

    def _stop_helpers(self) -> None:
        self._inplace.stop_kept(self.config.stop_grace)
        self._roster.close()
        self._node.close_master_store()
        self._warm.close()
        if self._presence is not None:
            self._presence.close()
        self._inplace.remove()

    def _descriptor(self) -> NodeDescriptor:
        """Our descriptor for the next round (``loop.node``)."""
        return self._node.descriptor(self._presence.port if self._presence is not None else 0)

    def _check_command(self) -> None:
        """Before anything else: a command that cannot start fails the job now (exit 127)."""
        problem = command_problem(self.config.command, self._environ)
        if problem is None:
            return
        try:
            store = self._session.open("to mark the job failed", MARK_FAILED_CONNECT_S)
        except AgentExitError as exc:
            log.warning("job not marked failed in the store: %s", exc.message or "SIGTERM")
        else:
            fail_job(self._session.rendezvous_on(store, self._node.bare()), problem)
            store.close()
        raise AgentExitError(ExitCode.BAD_COMMAND, problem)

    # -- the loop -------------------------------------------------------

    def _run(self) -> ExitCode:
        self._session.start(self._descriptor)
        if self.config.node_check:  # before a spare's wait too: promoted, it joins at once
            check_node(self._session.rdzv, check_interpreter(self.config.command))
        if not stand_by(self.config.standby_file, self._terminating, self._update):
            return ExitCode.PREEMPTED
        min_round = 0
        expected: int | None = None
        while True:
            if self._terminating.is_set():
                return ExitCode.PREEMPTED
            self._update(state=AgentState.RENDEZVOUS)
            self._warm.await_ready(self._terminating)
            rdzv = self._session.rdzv
            rdzv.node = self._descriptor()
            try:
                joined = self._join(rdzv, min_round, expected)
            except StoreUnavailableError as exc:
                self._session.lost("during rendezvous", exc)
                self._session.reconnect()
                self._update(last_restart_reason=RestartReason.STORE_LOST)
                min_round, expected = 0, None
                continue
            if isinstance(joined, ExitCode):
                return joined
            result, restarts = joined
            try:
                reason = self._run_round(rdzv, result, restarts)
            except StoreUnavailableError as exc:
                self._session.lost("while running", exc)
                reason = RestartReason.STORE_LOST
            min_round, expected = self._after_round(result, reason)

    def _join(
        self, rdzv: Rendezvous, min_round: int, expected: int | None
    ) -> tuple[RendezvousResult, int] | ExitCode:
        """The next round and the job's restart count, or the exit code if there is none.

        ``StoreUnavailableError`` passes through: the caller reconnects.
        """
        log.info("joining the rendezvous (round >= %d)", min_round)
        started = time.monotonic()
        try:
            result = rdzv.next_round(min_round, stop=self._terminating, expected=expected)
            restarts = rdzv.raise_restarts_to(self._restarts_seen)
            self._restarts_seen = max(self._restarts_seen, restarts)
        except RendezvousInterruptedError:
            return ExitCode.PREEMPTED
        except JobFailedError as exc:
            raise AgentExitError(ExitCode.USER_ERROR, f"job failed: {exc}") from exc
        except RendezvousClosedError as exc:
            log.info("%s", exc)
            return closed_job_exit(self._supervisor.workers_succeeded)
        except RendezvousTimeoutError as exc:
            raise AgentExitError(ExitCode.INFRA_ERROR, str(exc)) from exc
        except PermanentError as exc:
            raise AgentExitError(ExitCode.INFRA_ERROR, f"rendezvous: {exc}") from exc
        log.info(
            "round %d: node rank %d of %d, world size %d, master %s:%d "
            "(rendezvous took %.1f ms, restarts %d)",
            result.round,
            result.node_rank,
            result.num_nodes,
            result.world_size,
            result.master.addr,
            result.master.port,
            (time.monotonic() - started) * 1000,
            restarts,
        )
        self._update(store_error="")  # a round closed through the store: it answers
        self._node.joined(result)  # only node rank 0's master store is used
        self._update(
            round=result.round,
            world_size=result.world_size,
            node_rank=result.node_rank,
            nodes=result.num_nodes,
            restarts=restarts,
            holds_rank0=self._nproc > 0 and result.rank_offset == 0,
        )
        return result, restarts

    def _after_round(
        self, result: RendezvousResult, reason: RestartReason
    ) -> tuple[int, int | None]:
        """The next join's lowest round and expected size; reconnects after a store loss."""
        waiting = 0
        if reason is RestartReason.STORE_LOST:
            rdzv = self._session.reconnect()
            min_round = 0
            try:
                rdzv.end_round_after_store_loss(result.round)
            except StoreUnavailableError as exc:
                log.warning("store lost again: %s", exc)
        else:
            min_round = result.round + 1
            try:
                waiting = self._session.rdzv.waiting_count(result.round)
            except StoreUnavailableError:
                waiting = 0
        expected = expected_next(result.num_nodes, reason, waiting, self._settings.max_nodes)
        log.info("round %d over: %s; re-forming", result.round, reason.value)
        self._update(state=AgentState.RESTARTING, last_restart_reason=reason)
        return min_round, expected

    def _run_round(
        self, rdzv: Rendezvous, result: RendezvousResult, restarts: int
    ) -> RestartReason:
        """Run workers until the round ends; returns why (or raises ``AgentExitError``)."""
        monitor = RoundMonitor(rdzv, result, self._liveness, self._wake, lease=self._lease)
        monitor.start()  # grants this round's lease before any worker starts
        self._roster.round_started(rdzv, result)
        state_dir = self._inplace.state_dir
        ctx = launch_context(self.config, restarts, self._nproc, self._error_dir, state_dir)
        ctx = dataclasses.replace(ctx, joint=self._roster.joint, roles_file=self._roster.path)
        self._warm.ensure()
        env = {**self._environ, **self._lease.worker_env(result.round)}
        kept = self._inplace.take(self.config.stop_grace)
        group = kept
        if group is None:
            group = WorkerGroup(self.config.command, result, ctx, env, self._warm.fork)
        try:
            try:
                if kept is not None:
                    assert state_dir is not None
                    for local_rank, wenv in enumerate(kept.adopt(result, ctx, env)):
                        hand_round(state_dir, local_rank, result.round, wenv)
                else:
                    group.start()
            except CommandNotRunnableError as exc:
                fail_job(rdzv, str(exc), result.round)
                raise AgentExitError(ExitCode.BAD_COMMAND, str(exc)) from exc
            except LaunchError as exc:
                with contextlib.suppress(StoreUnavailableError):
                    rdzv.mark_stale(result.round, RestartReason.MEMBER_LEFT, str(exc))
                raise AgentExitError(ExitCode.INFRA_ERROR, str(exc)) from exc
            log.info(
                "round %d: %s workers (%d forked warm), pids %s",
                result.round,
                "kept" if kept is not None else "started",
                group.forked,
                group.pids,
            )
            self._update(state=AgentState.RUNNING)
            return self._supervisor.supervise(rdzv, result, group, monitor)
        except BaseException:
            group.stop(STORE_LOST_STOP_GRACE_S)
            raise
        finally:
            monitor.stop()


def launch_context(
    config: AgentConfig, restarts: int, nproc: int, error_dir: Path, state_dir: Path | None
) -> LaunchContext:
    """What every worker of a round needs besides the round itself."""
    return LaunchContext(
        config.run_id,
        restarts,
        config.max_restarts,
        nproc,
        error_dir,
        state_dir,
        config.teardown_grace,
        config.role,
    )
