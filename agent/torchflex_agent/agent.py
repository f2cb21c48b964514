"""The agent loop: rendezvous, run the worker group, react, repeat.

Where it sits: ``cli`` builds an ``ElasticAgent`` from the config and calls
``run()``, whose return value is the process exit code
(``torchflex_contract.exit_codes.ExitCode``). States (``AgentState``)::

    Init -> Rendezvous -> Running -> (Restarting -> Rendezvous)* -> Succeeded
                                  \\-> Leaving (SIGTERM, exit 75)
                                  \\-> Failed (restart budget spent, exit 1)

A warm spare (``standby``) stays in Init, store open, until it is promoted.

This module does the I/O of the loop: store connection, rendezvous calls,
worker launch, reports. Once a round's workers run, ``supervise`` watches
them and acts on what ``restart_policy`` decides (failures, fencing, leave).

Things that make a re-formed group train again fast, all started here:
the presence server (peers see this process die at once, ``liveness``),
the fork server (workers start without importing torch, ``prewarm``), and
the expected size of the next round (no last call when the survivors are
all there, ``rdzv_logic.expected_next``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchflex_agent.config import AgentConfig
from torchflex_agent.connecting import Connect, open_store
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
from torchflex_agent.health import ReportBoard, write_termination_log
from torchflex_agent.kvstore import KVStore
from torchflex_agent.liveness import LivenessSettings, PresenceServer, RoundMonitor
from torchflex_agent.prewarm import ForkServer
from torchflex_agent.progress import read_progress
from torchflex_agent.rdzv_logic import (
    SILENT,
    NodeDescriptor,
    RendezvousResult,
    RendezvousSettings,
    expected_next,
)
from torchflex_agent.rendezvous import Rendezvous, RendezvousInterruptedError
from torchflex_agent.restart_policy import GroupState, closed_job_exit
from torchflex_agent.standby import WAITING_MESSAGE, is_standby, read_standby, wait_for_promotion
from torchflex_agent.state_logic import keep_in_place, unblock_kept
from torchflex_agent.state_shm import create_dir as create_state_dir
from torchflex_agent.state_shm import hand_round, in_place_pids, mark_kept
from torchflex_agent.state_shm import remove_dir as remove_state_dir
from torchflex_agent.state_unblock import armed, signal_unblock
from torchflex_agent.supervise import (
    STORE_LOST_STOP_GRACE_S,
    AgentExitError,
    RoundSupervisor,
    fail_job,
)
from torchflex_agent.workers import (
    LaunchContext,
    WorkerGroup,
    command_problem,
    progress_file,
    start_fork_server,
)
from torchflex_contract import env as tfenv
from torchflex_contract.exit_codes import ExitCode
from torchflex_contract.progress import AgentReport, AgentState, RestartReason

if TYPE_CHECKING:
    from torchflex_agent.store_tcp import MasterStore

log = logging.getLogger(__name__)

# Longest wait for the worker fork server's imports before joining anyway.
_WARMUP_WAIT_S = 120.0
# Longest an agent with an unrunnable command tries to reach the store to
# mark the job failed before it exits anyway.
_MARK_FAILED_CONNECT_S = 5.0


def free_port() -> int:
    """A currently free TCP port; the master binds it shortly after (torchrun does the same)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


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
        self._connect = connect
        self._nproc = nproc
        self._environ = dict(environ)
        self.node_id = node_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._terminating = threading.Event()
        self._wake = threading.Event()
        self._board = ReportBoard(AgentReport(state=AgentState.INIT))
        self._error_dir = Path(tempfile.mkdtemp(prefix="torchflex-errors-"))
        self._settings = RendezvousSettings(
            config.min_nodes,
            config.max_nodes,
            config.last_call,
            config.join_timeout,
            config.liveness_timeout,
        )
        self._liveness = LivenessSettings(config.heartbeat_interval, config.liveness_timeout)
        self._lease = Lease(
            self._error_dir / "lease",
            lease_duration(config.heartbeat_interval, config.liveness_timeout),
        )
        self._presence: PresenceServer | None = None
        self._fork = fork
        self._state_dir: Path | None = None
        """The state API's in-memory copies (``state_shm``): the agent's for its whole life."""
        self._kept: WorkerGroup | None = None
        """Workers kept across a re-form (the state API's in-place re-forming)."""
        self._restarts_seen = 0
        """Highest job-wide restart count seen: republished if the store forgot it."""
        self._prev_rank = -1
        self._master_store: MasterStore | None = None
        self._supervisor = RoundSupervisor(
            config,
            self.node_id,
            self._liveness,
            self._lease,
            self._wake,
            self._terminating,
            self._update,
            self._counted,
            self._keep_workers,
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
        try:
            self._state_dir = create_state_dir()
        except OSError as exc:
            log.warning("no in-memory state folder (the state API keeps no copies): %s", exc)
        self._ensure_fork_server()

    def _ensure_fork_server(self) -> None:
        if not self.config.prewarm or self._nproc < 1:
            return
        if self._fork is not None:
            if self._fork.alive:
                return
            log.warning("worker fork server died; starting a new one")
            self._fork.close()
            self._fork = None
        self._fork = start_fork_server(self.config.command, self._environ)

    def _await_warm_workers(self) -> None:
        """Before joining, let the fork server finish importing (bounded).

        Joining a running group stops its workers; if ours were still
        importing torch, the whole group would idle until they were ready.
        Waiting here, the group trains on meanwhile.
        """
        if self._fork is None:
            return
        deadline = time.monotonic() + _WARMUP_WAIT_S
        while not self._terminating.is_set() and time.monotonic() < deadline:
            if self._fork.wait_ready(0.1) or not self._fork.alive:
                return

    def _keep_workers(
        self, reason: RestartReason, lost: tuple[tuple[int, str], ...], group: WorkerGroup
    ) -> bool:
        """The supervisor asks on a re-form: keep workers that re-form in place?"""
        if self._state_dir is None or self._terminating.is_set():
            return False
        state, _ = group.poll()
        declared = in_place_pids(self._state_dir, len(group.pids))
        running = state is GroupState.RUNNING
        silent = any(how == SILENT for _rank, how in lost)
        unblockable = armed(self._state_dir, group.pids, group.round)
        if not keep_in_place(
            reason, silent, running, declared, group.pids, unblockable=unblockable
        ):
            return False
        log.info("keeping workers %s: they re-form in place", group.pids)
        for local_rank in range(len(group.pids)):
            mark_kept(self._state_dir, local_rank, group.round)
        if unblock_kept(reason):  # a collective may wait on the lost member: end it now
            nodes = [rank for rank, _how in lost]
            for local_rank in range(len(group.pids)):
                signal_unblock(self._state_dir, local_rank, group.round, nodes)
        self._kept = group
        return True

    def _stop_kept(self, grace: float) -> None:
        if self._kept is not None:
            self._kept.stop(grace)
            self._kept = None

    def _stop_helpers(self) -> None:
        self._stop_kept(self.config.stop_grace)
        self._close_master_store()
        if self._fork is not None:
            self._fork.close()
        if self._presence is not None:
            self._presence.close()
        if self._state_dir is not None:
            remove_state_dir(self._state_dir)

    def _descriptor(self) -> NodeDescriptor:
        """Our descriptor for the next round, with a fresh master store listening on its port."""
        self._close_master_store()
        port, agent_store = 0, False
        try:
            # Imported here: it loads torch, which etcd-only agents may not need before.
            from torchflex_agent.store_tcp import MasterStore

            master = MasterStore()
            self._master_store = master
            port, agent_store = master.port, True
        except (StoreUnavailableError, ImportError) as exc:
            log.warning("workers' rank 0 will host their store: %s", exc)
            port = free_port()
        watch = self._presence.port if self._presence is not None else 0
        return NodeDescriptor(
            self.node_id,
            self.config.node_addr,
            port,
            self._nproc,
            watch,
            self._prev_rank,
            agent_store,
            self._environ.get(tfenv.POD_NAME, ""),
        )

    def _close_master_store(self) -> None:
        if self._master_store is not None:
            self._master_store.close()
            self._master_store = None

    def _open_store(self, why: str, timeout: float | None = None) -> KVStore:
        """Connect within ``timeout`` (default: the join timeout); SIGTERM ends it (exit 75)."""
        deadline = time.monotonic() + (self.config.join_timeout if timeout is None else timeout)
        try:
            store = open_store(
                self._connect,
                what=f"{self.config.store_name} ({why})",
                deadline=deadline,
                stop=self._terminating,
                on_error=lambda error: self._update(store_error=error),
            )
            self._update(store_error="")  # it answers again
            return store
        except RendezvousInterruptedError as exc:
            log.info("%s", exc)
            raise AgentExitError(ExitCode.PREEMPTED) from exc
        except StoreUnavailableError as exc:
            raise AgentExitError(ExitCode.INFRA_ERROR, str(exc)) from exc

    def _check_command(self) -> None:
        """Before anything else: a command that cannot start fails the job now (exit 127)."""
        problem = command_problem(self.config.command, self._environ)
        if problem is None:
            return
        try:
            store = self._open_store("to mark the job failed", _MARK_FAILED_CONNECT_S)
        except AgentExitError as exc:
            log.warning("job not marked failed in the store: %s", exc.message or "SIGTERM")
        else:
            node = NodeDescriptor(self.node_id, self.config.node_addr, 0, self._nproc)
            fail_job(Rendezvous(store, self.config.run_id, node, self._settings), problem)
            store.close()
        raise AgentExitError(ExitCode.BAD_COMMAND, problem)

    def _stand_by(self) -> bool:
        """A warm spare waits here until promoted; False if SIGTERM came first.

        Everything that makes no member is done by now (fork server importing,
        store open, master store and its torch import ready), so a promoted
        spare only joins. Meanwhile the report stays ``Init`` at round -1, as a
        pod waiting to join, with the standby line as its message.
        """
        if self.config.standby_file is None:
            return True
        path = Path(self.config.standby_file)
        if not is_standby(read_standby(path)):
            return True
        self._update(message=WAITING_MESSAGE)
        waited = wait_for_promotion(path, self._terminating)
        self._update(message="")
        return waited is not None

    def _run(self) -> ExitCode:
        store = self._open_store("startup")
        rdzv = Rendezvous(store, self.config.run_id, self._descriptor(), self._settings)
        if not self._stand_by():
            return ExitCode.PREEMPTED
        min_round = 0
        expected: int | None = None
        while True:
            if self._terminating.is_set():
                return ExitCode.PREEMPTED
            self._update(state=AgentState.RENDEZVOUS)
            self._await_warm_workers()
            rdzv.node = self._descriptor()
            log.info("joining the rendezvous (round >= %d)", min_round)
            started = time.monotonic()
            try:
                result = rdzv.next_round(min_round, stop=self._terminating, expected=expected)
                restarts = rdzv.raise_restarts_to(self._restarts_seen)
                self._restarts_seen = max(self._restarts_seen, restarts)
            except RendezvousInterruptedError:
                return ExitCode.PREEMPTED
            except StoreUnavailableError as exc:
                log.warning("store lost during rendezvous: %s; reconnecting", exc)
                self._update(store_error=str(exc))
                store = self._open_store("reconnect")
                rdzv = Rendezvous(store, self.config.run_id, rdzv.node, self._settings)
                self._update(last_restart_reason=RestartReason.STORE_LOST)
                min_round = 0
                expected = None
                continue
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
            self._prev_rank = result.node_rank
            self._update(store_error="")  # a round closed through the store: it answers
            if result.node_rank != 0:
                self._close_master_store()  # only node rank 0's is used
            self._update(
                round=result.round,
                world_size=result.world_size,
                node_rank=result.node_rank,
                nodes=result.num_nodes,
                restarts=restarts,
                holds_rank0=self._nproc > 0 and result.rank_offset == 0,
            )
            try:
                reason = self._run_round(rdzv, result, restarts)
            except StoreUnavailableError as exc:
                log.warning("store lost while running: %s; reconnecting", exc)
                self._update(store_error=str(exc))
                reason = RestartReason.STORE_LOST
            waiting = 0
            if reason is RestartReason.STORE_LOST:
                store.close()
                store = self._open_store("reconnect")
                rdzv = Rendezvous(store, self.config.run_id, rdzv.node, self._settings)
                min_round = 0
                try:
                    rdzv.end_round_after_store_loss(result.round)
                except StoreUnavailableError as exc:
                    log.warning("store lost again: %s", exc)
            else:
                min_round = result.round + 1
                try:
                    waiting = rdzv.waiting_count(result.round)
                except StoreUnavailableError:
                    waiting = 0
            expected = expected_next(result.num_nodes, reason, waiting, self.config.max_nodes)
            log.info("round %d over: %s; re-forming", result.round, reason.value)
            self._update(state=AgentState.RESTARTING, last_restart_reason=reason)

    def _run_round(
        self, rdzv: Rendezvous, result: RendezvousResult, restarts: int
    ) -> RestartReason:
        """Run workers until the round ends; returns why (or raises ``AgentExitError``)."""
        monitor = RoundMonitor(rdzv, result, self._liveness, self._wake, lease=self._lease)
        monitor.start()  # grants this round's lease before any worker starts
        ctx = LaunchContext(
            self.config.run_id,
            restarts,
            self.config.max_restarts,
            self._nproc,
            self._error_dir,
            self._state_dir,
            self.config.teardown_grace,
        )
        self._ensure_fork_server()
        env = {**self._environ, **self._lease.worker_env(result.round)}
        kept, self._kept = self._kept, None
        if kept is not None and kept.poll()[0] is not GroupState.RUNNING:
            kept.stop(self.config.stop_grace)  # one exited meanwhile: the restart path
            kept = None
        group = kept
        if group is None:
            group = WorkerGroup(self.config.command, result, ctx, env, self._fork)
        try:
            try:
                if kept is not None:
                    assert self._state_dir is not None
                    for local_rank, wenv in enumerate(kept.adopt(result, ctx, env)):
                        hand_round(self._state_dir, local_rank, result.round, wenv)
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
