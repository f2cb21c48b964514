"""Why a worker pod ended, and whether it counts against ``backoffLimit``.

Where it sits: the planner calls ``classify`` for every Failed worker pod.
The exit code contract (``torchflex_contract.exit_codes``) decides first
hand; pod-level evidence (``DisruptionTarget`` condition, eviction and
node-loss status reasons, a lost node, a deletion that came first) overrides
it, because a pod killed by the platform or deleted on purpose is never the
user's fault.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType

from torchflex_contract.exit_codes import Disposition, ExitCode, disposition
from torchflex_contract.progress import AgentReport
from torchflex_operator.model.observed import Observed, PodView
from torchflex_operator.model.status import WorkerException
from torchflex_operator.model.vocabulary import EventReason, Reason

# DisruptionTarget condition reasons (k8s >= 1.26) and what they mean here.
_DISRUPTION_REASONS: Mapping[str, Reason] = MappingProxyType(
    {
        "PreemptionByScheduler": Reason.PREEMPTED,
        "PreemptionByKubeScheduler": Reason.PREEMPTED,
        "DeletionByTaintManager": Reason.NODE_LOST,
        "DeletionByPodGC": Reason.NODE_LOST,
        "EvictionByEvictionAPI": Reason.EVICTED,
        "TerminationByKubelet": Reason.EVICTED,
    }
)
# pod.status.reason values the kubelet or node controller set on platform kills.
_STATUS_REASONS: Mapping[str, Reason] = MappingProxyType(
    {
        "Evicted": Reason.EVICTED,
        "Preempting": Reason.PREEMPTED,
        "NodeLost": Reason.NODE_LOST,
        "Shutdown": Reason.NODE_LOST,
        "NodeShutdown": Reason.NODE_LOST,
        "Terminated": Reason.NODE_LOST,
        "UnexpectedAdmissionError": Reason.EVICTED,
    }
)


@dataclasses.dataclass(frozen=True)
class Failure:
    reason: Reason
    counted: bool
    exit_code: int | None
    message: str
    fatal: bool = False
    """Retrying cannot help (the command cannot be started): the job fails now."""

    @property
    def event_reason(self) -> EventReason:
        if self.reason is Reason.PREEMPTED:
            return EventReason.PREEMPTED
        if self.reason is Reason.NODE_LOST:
            return EventReason.NODE_LOST
        return EventReason.POD_FAILED


def final_report(raw: str) -> AgentReport | None:
    """The agent's final report in a termination message; None if it is not one."""
    raw = raw.strip()
    if not raw.startswith("{"):
        return None
    try:
        return AgentReport.from_json(raw)
    except ValueError:
        return None


def report_message(raw: str) -> str:
    """The human part of a termination message: an AgentReport's message or raw logs."""
    report = final_report(raw)
    return report.message if report is not None else raw.strip()[-1024:]


def root_cause(
    pod: str, report: AgentReport | None, shown: WorkerException | None
) -> WorkerException | None:
    """The worker exception behind a failed pod, for ``lastFailure.rootCause``.

    Its agent's own ``root_cause`` when it belongs to the round the agent
    ended in (an older one was handled by a restart). Otherwise the one
    status already shows, when the pod ended in that round or before it: the
    pod went down with the group that exception ended (its peers exit
    without one of their own), so the user still sees the cause, with the
    pod that reported it. A pod without a final report gets none.
    """
    if report is None:
        return None
    cause = report.root_cause
    if cause is not None and (cause.round < 0 or cause.round >= report.round):
        return WorkerException(
            type=cause.type,
            message=cause.message,
            frames=cause.frames,
            rank=cause.rank,
            round=cause.round,
            pod=pod,
        )
    if shown is not None and 0 <= report.round <= shown.round:
        return shown
    return None


def classify(pod: PodView, observed: Observed) -> Failure:
    """Classify a worker pod in phase Failed."""
    message = report_message(pod.message)
    if pod.disruption_reason is not None:
        reason = _DISRUPTION_REASONS.get(pod.disruption_reason, Reason.EVICTED)
        return Failure(reason, False, pod.exit_code, message or pod.disruption_reason)
    if (platform := _STATUS_REASONS.get(pod.status_reason or "")) is not None:
        return Failure(platform, False, pod.exit_code, message)
    if observed.node_lost(pod):
        return Failure(Reason.NODE_LOST, False, pod.exit_code, message)
    if pod.terminating:
        # Deleted before it ended (scale-down, rolling update, suspend, kubectl
        # delete): whatever it exited with answers the SIGTERM, not a fault.
        return Failure(Reason.POD_DELETED, False, pod.exit_code, message)
    if pod.exit_code is None:
        # Failed without a container exit (e.g. the kubelet rejected it): platform.
        return Failure(Reason.EVICTED, False, None, message or (pod.status_reason or ""))
    if pod.terminated_reason == "OOMKilled":
        return Failure(Reason.OOM_KILLED, True, pod.exit_code, message or "OOMKilled")
    if pod.exit_code == ExitCode.BAD_COMMAND:
        return Failure(Reason.USER_ERROR, True, pod.exit_code, message, fatal=True)
    if pod.exit_code == ExitCode.BAD_NODE:
        # Its node failed the opt-in check before it joined: the node's fault, not the
        # job's; replaced elsewhere (steps.failed adds the node to avoidedNodes).
        return Failure(Reason.BAD_NODE, False, pod.exit_code, message)
    kind = disposition(pod.exit_code)
    if kind is Disposition.RETRYABLE_FREE:
        return Failure(Reason.PREEMPTED, False, pod.exit_code, message)
    if kind is Disposition.PERMANENT:
        return Failure(Reason.USER_ERROR, True, pod.exit_code, message)
    # RETRYABLE_COUNTED, or exit 0 in a pod that still failed (another container).
    return Failure(Reason.INFRA_ERROR, True, pod.exit_code, message)


def succeeded(pod: PodView) -> bool:
    """The worker's agent exited 0: the worker group is done (restartPolicy Never).

    A pod that was being deleted may exit 0 on SIGTERM; that ends the pod,
    not the training, so it never completes the job.
    """
    return pod.phase == "Succeeded" and not pod.terminating
