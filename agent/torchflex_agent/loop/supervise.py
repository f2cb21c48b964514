"""Supervising one round: watch the started worker group, decide, act.

Where it sits: ``loop.agent.ElasticAgent`` runs the rendezvous loop and starts
each round's workers; it then hands the group to
``RoundSupervisor.supervise``, which returns why the round ended (a
``RestartReason``: the agent re-forms) or raises ``AgentExitError`` with the
process exit code. What to do on each observation is decided by
``loop.logic.policy`` (pure); this module does the I/O of acting on it: the
job-wide failure count and restart budget, fencing (``fence``) when this
member cannot prove it still is one, the lost members' pods in the report,
and leaving on SIGTERM. Everything the round shares goes through the
``Rendezvous``'s operations (``mark_finished``, ``report_failure``,
``count_failure``, ``lost``...); this module names no store key.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import NoReturn, assert_never

from torchflex_agent.errors import StoreUnavailableError
from torchflex_agent.fence import Lease, reform_grace
from torchflex_agent.loop import stalls
from torchflex_agent.loop.logic.config import AgentConfig
from torchflex_agent.loop.logic.policy import (
    Action,
    FailureVerdict,
    Observation,
    budget_exhausted,
    decide,
    judge_failure,
    root_cause,
)
from torchflex_agent.rendezvous.liveness import LivenessSettings, RoundMonitor, probe_peers
from torchflex_agent.rendezvous.logic import SILENT, RendezvousResult
from torchflex_agent.rendezvous.protocol import Rendezvous
from torchflex_agent.workers.group import WorkerGroup, first_failure
from torchflex_agent.workers.hangs import in_teardown
from torchflex_agent.workers.logic import GroupState
from torchflex_contract.exit_codes import ExitCode
from torchflex_contract.progress import (
    AgentState,
    HangKind,
    RestartReason,
    StallReport,
    StragglerReport,
)

log = logging.getLogger(__name__)

# After a local worker failure, how long to look for a peer's departure
# before counting the failure against the restart budget.
_FAILURE_PROBE_S = 0.5
STORE_LOST_STOP_GRACE_S = 1.0


class AgentExitError(Exception):
    """Ends the agent with ``code``: raised wherever the outcome is final."""

    def __init__(self, code: ExitCode, message: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def fail_job(rdzv: Rendezvous, problem: str, round_no: int | None = None) -> None:
    """Close the job's rendezvous as failed (and end our round): nothing will run.

    Other agents stop at their next store read instead of re-forming to
    try the same command, and replacements exit at once instead of
    waiting for a round that cannot train.
    """
    try:
        rdzv.close_job("failed", problem)
        if round_no is not None:
            rdzv.mark_stale(round_no, RestartReason.WORKER_FAILED, problem)
    except StoreUnavailableError as exc:
        log.warning("job not marked failed in the store: %s", exc)


@dataclasses.dataclass
class RoundSupervisor:
    """The agent's side a running round needs: its settings, events and report."""

    config: AgentConfig
    node_id: str
    liveness: LivenessSettings
    lease: Lease
    wake: threading.Event
    """Set by the round monitor and by SIGTERM: look now, not at the next interval."""
    terminating: threading.Event
    update: Callable[..., None]
    """Changes fields of the agent's report (``AgentReport``)."""
    counted: Callable[[int], None]
    """Called with the job-wide restart count after this agent counted a failure."""
    keep_workers: (
        Callable[[RestartReason, tuple[tuple[int, str], ...], WorkerGroup], bool] | None
    ) = None
    """Asked on a re-form (reason, the members declared lost: node rank and how): True
    when the agent keeps the group running to re-form in place (the state API),
    instead of stopping it."""
    workers_succeeded: bool = False
    """Whether the round ``loop.supervise`` last watched ended with every local worker
    exited 0 (``loop.logic.policy.closed_job_exit``)."""

    _hang_reported: bool = False
    _stragglers: tuple[StragglerReport, ...] = ()
    _hang_claimed: float | None = None
    """The timeout in force when this member declared the round hung (it counts it)."""
    _next_probe: float = 0.0
    """Seconds after the job completed elsewhere when ``supervise`` next samples stacks."""

    def supervise(
        self, rdzv: Rendezvous, result: RendezvousResult, group: WorkerGroup, monitor: RoundMonitor
    ) -> RestartReason:
        self.workers_succeeded = False
        self._hang_reported = False
        self._hang_claimed = None
        self._next_probe = self.config.teardown_grace
        watch = stalls.StallWatch(rdzv, result, self.config.hang_timeout)
        if self._stragglers:  # a new round: its own comparison
            self._stragglers = ()
            self.update(stragglers=())
        while True:
            self.wake.wait(self.config.monitor_interval)
            self.wake.clear()
            if self.lease.expired():
                # First, before anything else this wake-up: after a freeze the
                # workers run again right now, and only a SIGKILL stops them mid-write.
                return self._fence(rdzv, result, group, "its heartbeat lease ran out")
            event = monitor.event
            stale = event.reason if event is not None else None
            if event is not None and stale is RestartReason.STORE_LOST:
                log.warning("round %d: store lost: %s", result.round, event.detail)
                self.update(store_error=event.detail)
            state, failures = group.poll()
            if state is GroupState.RUNNING:
                state = self._end_completion_hang(result, group, monitor)
            if group.hang is not None and not self._hang_reported:
                self._hang_reported = True
                self.update(hang=group.hang)
            self.workers_succeeded = state is GroupState.SUCCEEDED
            if state is GroupState.RUNNING and stale is None and not self.terminating.is_set():
                stale = self._declare_hang(rdzv, result, watch.check(group))
                if watch.stragglers != self._stragglers:
                    self._stragglers = watch.stragglers
                    self._report_stragglers(result)
            if state is GroupState.SUCCEEDED and stale is None:
                # The stale watcher may lag the workers by a round trip; a
                # peer's leave makes workers exit 0 too, so ask the store.
                mark = rdzv.stale_mark(result.round)
                stale = mark.reason if mark is not None else None
            action = decide(Observation(state, stale, self.terminating.is_set()))
            if action is Action.CONTINUE:
                continue
            if action is Action.LEAVE:
                self._leave(rdzv, result, group)
            if action is Action.SUCCEED:
                rdzv.mark_finished(result.round, result.node_rank)
                rdzv.close_job("succeeded")
                group.stop(0.0)
                raise AgentExitError(ExitCode.SUCCESS)
            if action is Action.REFORM and stale is RestartReason.HANG:
                return self._on_hang(rdzv, result, group, watch)
            if action is Action.REFORM:
                assert stale is not None
                silent = False
                lost: tuple[tuple[int, str], ...] = ()
                if stale is RestartReason.MEMBER_LOST:
                    lost = rdzv.lost(result.round)
                    self._report_lost(result, lost)
                    if any(rank == result.node_rank for rank, _how in lost):
                        return self._fence(rdzv, result, group, "the group declared it lost")
                    silent = any(how == SILENT for _rank, how in lost)
                if self.keep_workers is not None and self.keep_workers(stale, lost, group):
                    return stale
                grace = reform_grace(
                    self.config.stop_grace,
                    STORE_LOST_STOP_GRACE_S,
                    store_lost=stale is RestartReason.STORE_LOST,
                    silent=silent,
                )
                group.stop(grace)
                return stale
            if action is Action.INVESTIGATE_FAILURE:
                failure = first_failure(failures)  # the earliest recorded, as torchrun
                if failure.cause is not None:
                    self.update(root_cause=failure.cause)
                return self._on_failure(rdzv, result, group, failure.describe())
            assert_never(action)  # mypy: every Action has its branch above

    def _report_stragglers(self, result: RendezvousResult) -> None:
        for st in self._stragglers:
            log.warning(
                "round %d: straggler: node rank %d (pod %s) forward %.4f s, %.1fx the others'",
                result.round, st.node_rank, st.pod or "?", st.forward_s, st.ratio,
            )  # fmt: skip
        self.update(stragglers=self._stragglers)

    def _declare_hang(
        self, rdzv: Rendezvous, result: RendezvousResult, limit: float | None
    ) -> RestartReason | None:
        """Mark the round hung when ``limit`` (the timeout in force) says so; the reason
        the round is stale now (ours, or a mark that beat ours), else None."""
        if limit is None:
            return None
        detail = f"no training progress for {limit:.0f} s (seen by node rank {result.node_rank})"
        if rdzv.claim_stale(result.round, RestartReason.HANG, detail):
            self._hang_claimed = limit
            log.warning("round %d: hang: %s", result.round, detail)
            return RestartReason.HANG
        mark = rdzv.stale_mark(result.round)
        return mark.reason if mark is not None else None

    def _on_hang(
        self,
        rdzv: Rendezvous,
        result: RendezvousResult,
        group: WorkerGroup,
        watch: stalls.StallWatch,
    ) -> RestartReason:
        """The round was declared hung: record every local rank (stacks, steps), let node
        rank 0 assemble the report, restart the workers; the declaring member counts it."""
        stalls.record(rdzv, result, group, time.monotonic)
        limit = self._hang_claimed or watch.limit or 0.0
        group.stop(self.config.stop_grace)
        if result.node_rank == 0:

            def report(stall: StallReport) -> None:
                log.warning("round %d: %s", result.round, stall.summary())
                self.update(stall=stall, message=stall.summary())

            stalls.assemble_later(rdzv, result, limit, report)
        if self._hang_claimed is not None:
            restarts = rdzv.count_failure(result.round)
            if restarts is not None:
                self.counted(restarts)
                if budget_exhausted(restarts, self.config.max_restarts):
                    text = (
                        f"hang after {restarts - 1} restarts (max {self.config.max_restarts}): "
                        f"no training progress for {limit:.0f} s"
                    )
                    rdzv.close_job("failed", text)
                    raise AgentExitError(ExitCode.USER_ERROR, text)
        return RestartReason.HANG

    def _end_completion_hang(
        self, result: RendezvousResult, group: WorkerGroup, monitor: RoundMonitor
    ) -> GroupState:
        """End workers that run on after the job completed on another member.

        Another member finished the job (its workers all exited 0 and it
        closed the rendezvous as succeeded) and ours still run. Every
        ``teardown_grace`` seconds their stacks are sampled: all of them
        tearing down (``hangs.in_teardown``: in ``destroy_process_group``, a
        process-group destructor, the bootstrap's exit) means the work is
        done, so they are ended and the group succeeded. Past
        ``completion_grace`` they are ended whatever they do; one still in
        the script's own code fails this member, naming the hang. Either way
        the stacks go to the log and the report.
        """
        completed_at = monitor.job_completed_at
        if completed_at is None:
            return GroupState.RUNNING
        late = time.time() - completed_at
        if late >= self.config.completion_grace:
            hang = group.end_hung(completed_at)
        elif late >= self._next_probe:
            self._next_probe = late + max(self.config.teardown_grace, 1.0)
            stacks = group.stacks()
            if not stacks or not all(in_teardown(stack) for _local, stack in stacks):
                return GroupState.RUNNING
            hang = group.end_hung(completed_at, stacks)
        else:
            return GroupState.RUNNING
        if hang is None:  # they exited meanwhile
            return group.poll()[0]
        self._hang_reported = True
        if hang.kind is HangKind.TEARDOWN:
            self.update(hang=hang)
            return GroupState.SUCCEEDED
        text = f"{hang.summary()} (completion grace {self.config.completion_grace:g} s)"
        self.update(hang=hang, message=text)
        log.warning("round %d: %s", result.round, text)
        raise AgentExitError(ExitCode.USER_ERROR, text)

    def _fence(
        self, rdzv: Rendezvous, result: RendezvousResult, group: WorkerGroup, why: str
    ) -> RestartReason:
        """This member cannot prove it is one: SIGKILL its workers now, then re-form.

        No grace: peers may already have re-formed without us, and a worker
        that checkpoints now would write over the live group's state.
        """
        self.lease.revoke()
        group.signal(signal.SIGKILL)
        log.warning(
            "round %d: fenced: node rank %d %s; workers killed",
            result.round,
            result.node_rank,
            why,
        )
        group.stop(0.0)
        rdzv.mark_stale(
            result.round, RestartReason.MEMBER_LOST, f"node rank {result.node_rank} fenced: {why}"
        )  # a store error here is the StoreLost path
        return RestartReason.MEMBER_LOST

    def _report_lost(self, result: RendezvousResult, lost: tuple[tuple[int, str], ...]) -> None:
        """Name the pods of members this round declared lost (read by the operator)."""
        pods = tuple(
            result.nodes[rank].pod
            for rank, _how in lost
            if 0 <= rank < result.num_nodes and result.nodes[rank].pod
        )
        if pods:
            log.warning("round %d: lost member pod(s): %s", result.round, ", ".join(pods))
            self.update(lost_pods=pods, lost_round=result.round)

    def _on_failure(
        self, rdzv: Rendezvous, result: RendezvousResult, group: WorkerGroup, message: str
    ) -> RestartReason:
        log.warning("round %d: %s", result.round, message)
        self.update(message=message)
        rdzv.report_failure(result.round, result.node_rank, message)
        mark = probe_peers(rdzv, result, _FAILURE_PROBE_S, self.liveness)
        verdict = judge_failure(mark.reason if mark is not None else None)
        if verdict is FailureVerdict.COUNT:
            restarts = rdzv.count_failure(result.round)
            if restarts is None:
                verdict = FailureVerdict.COUNTED_ELSEWHERE
            else:
                self.counted(restarts)
                if budget_exhausted(restarts, self.config.max_restarts):
                    # Peers probed already: a failure that hit several nodes
                    # at once has had time to arrive.
                    message = root_cause(message, rdzv.peer_failures(result))
                    text = (
                        f"worker failure after {restarts - 1} restarts "
                        f"(max {self.config.max_restarts}): {message}"
                    )
                    rdzv.close_job("failed", text)
                    rdzv.mark_stale(result.round, RestartReason.WORKER_FAILED, message)
                    group.stop(self.config.stop_grace)
                    raise AgentExitError(ExitCode.USER_ERROR, text)
                rdzv.mark_stale(result.round, RestartReason.WORKER_FAILED, message)
        log.info("round %d: worker failure judged %s", result.round, verdict.value)
        if mark is not None and mark.reason is RestartReason.MEMBER_LOST:
            self._report_lost(result, rdzv.lost(result.round))
        group.stop(self.config.stop_grace)
        if verdict is FailureVerdict.COLLATERAL and mark is not None:
            return mark.reason
        return RestartReason.WORKER_FAILED

    def _leave(self, rdzv: Rendezvous, result: RendezvousResult, group: WorkerGroup) -> NoReturn:
        """SIGTERM: tell peers first (so their workers stop in step), then drain ours."""
        self.update(state=AgentState.LEAVING)
        try:
            rdzv.mark_stale(result.round, RestartReason.MEMBER_LEFT, self.node_id)
        except StoreUnavailableError as exc:
            log.warning("could not announce leave: %s", exc)
        group.signal(signal.SIGTERM)
        if not group.wait(self.config.termination_grace):
            log.warning("workers still running after %.0fs; killing", self.config.termination_grace)
        group.stop(0.0)
        raise AgentExitError(ExitCode.PREEMPTED)
