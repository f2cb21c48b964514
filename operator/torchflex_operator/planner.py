"""The pure reconcile: ``plan(job, status, observed, now) -> Plan``.

Where it sits: the heart of the operator. ``reconciler`` observes, calls
``plan`` and hands the result to ``apply``; nothing here touches the API or
the clock, so every decision is table-tested (tests/unit/operator). One
pass looks at the whole observed state of one job (level-triggered) and
decides: pods and Services to create, pods to delete (gracefully, or forced
off a lost node), the complete new status, Events, and when to look again.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any

from torchflex_contract import labels
from torchflex_contract.exit_codes import ExitCode
from torchflex_operator import (
    backends,
    builders,
    completion,
    events,
    netpol,
    pacing,
    rollout,
    verdicts,
)
from torchflex_operator.conditions import set_condition
from torchflex_operator.failures import classify, succeeded
from torchflex_operator.observed import Observed, PodView
from torchflex_operator.settings import Settings
from torchflex_operator.spec import CleanPodPolicy, JobSpec
from torchflex_operator.timestamps import format_time, parse_time
from torchflex_operator.vocabulary import ConditionType, EventReason, EventType, Phase, Reason

Manifest = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class PodDelete:
    name: str
    uid: str
    force: bool = False
    """Grace period 0: only for pods stuck terminating on a lost node."""
    grace_s: int | None = None
    """A shorter grace period than the pod's own (fencing a silent pod); None: the pod's."""


@dataclasses.dataclass(frozen=True)
class Event:
    type: EventType
    reason: EventReason
    message: str


@dataclasses.dataclass
class Plan:
    create_pods: list[Manifest] = dataclasses.field(default_factory=list)
    create_services: list[Manifest] = dataclasses.field(default_factory=list)
    create_network_policies: list[Manifest] = dataclasses.field(default_factory=list)
    delete_network_policies: list[str] = dataclasses.field(default_factory=list)
    delete_pods: list[PodDelete] = dataclasses.field(default_factory=list)
    status: Manifest = dataclasses.field(default_factory=dict)
    events: list[Event] = dataclasses.field(default_factory=list)
    requeue_after: float | None = None
    delete_job: bool = False
    replacements: list[Reason] = dataclasses.field(default_factory=list)
    """Reason of each failed worker handled this pass (metrics)."""

    def wake_in(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        if self.requeue_after is None or seconds < self.requeue_after:
            self.requeue_after = seconds

    def delete(self, pod: PodView, *, force: bool = False, grace_s: int | None = None) -> None:
        if all(d.name != pod.name for d in self.delete_pods):
            self.delete_pods.append(PodDelete(pod.name, pod.uid, force, grace_s))

    def event(self, etype: EventType, reason: EventReason, message: str) -> None:
        self.events.append(Event(etype, reason, message))


def backoff_delay(streak: int, settings: Settings) -> float:
    """Replacement delay after ``streak`` consecutive replacement rounds (1, 2, 4, ... cap)."""
    if streak <= 0:
        return 0.0
    return float(min(settings.backoff_cap_s, settings.backoff_base_s * 2 ** (streak - 1)))


class _Pass:
    """State of one planning pass; methods are its steps, in order."""

    def __init__(
        self,
        job: JobSpec,
        prior: Mapping[str, Any],
        observed: Observed,
        now: dt.datetime,
        settings: Settings,
    ) -> None:
        self.job = job
        self.prior = prior
        self.obs = observed
        self.now = now
        self.settings = settings
        self.plan = Plan()
        self.s: Manifest = copy.deepcopy(dict(prior))
        self.conds: list[dict[str, Any]] = self.s.setdefault("conditions", [])
        try:
            self.prior_phase: Phase | None = Phase(prior.get("phase", ""))
        except ValueError:
            self.prior_phase = None
        self.workers = observed.workers()
        self.fatal = ""  # set by account_failures: a failure retrying cannot help

    # -- helpers -------------------------------------------------------------

    def _time(self, key: str) -> dt.datetime | None:
        return parse_time(self.s.get(key))

    def _since(self, key: str) -> float | None:
        when = self._time(key)
        return None if when is None else (self.now - when).total_seconds()

    def _all_pods(self) -> list[PodView]:
        return list(self.obs.pods)

    # -- terminal handling -----------------------------------------------------

    def finish(self, phase: Phase, reason: Reason, message: str) -> None:
        self.s["phase"] = phase.value
        self.s["completionTime"] = format_time(self.now)
        self.s.pop("belowMinSince", None)
        self.s.pop("backoffUntil", None)
        ctype = ConditionType.SUCCEEDED if phase is Phase.SUCCEEDED else ConditionType.FAILED
        set_condition(self.conds, ctype, status=True, reason=reason, message=message, now=self.now)
        etype = EventType.NORMAL if phase is Phase.SUCCEEDED else EventType.WARNING
        ereason = EventReason.SUCCEEDED if phase is Phase.SUCCEEDED else EventReason.FAILED
        self.plan.event(etype, ereason, f"{reason.value}: {message}")

    def cleanup(self) -> None:
        """Stop pods of a finished job per ``cleanPodPolicy``; then TTL."""
        policy = self.job.clean_pod_policy
        for pod in self._all_pods():
            if pod.terminating or policy is CleanPodPolicy.NONE:
                continue
            if policy is CleanPodPolicy.ALL or not pod.finished:
                self.plan.delete(pod)
        ttl = self.job.ttl_seconds_after_finished
        done = self._time("completionTime")
        if ttl is not None and done is not None:
            left = ttl - (self.now - done).total_seconds()
            if left <= 0:
                self.plan.delete_job = True
                self.plan.event(
                    EventType.NORMAL,
                    EventReason.TTL_EXPIRED,
                    f"deleting job {ttl}s after it finished",
                )
            else:
                self.plan.wake_in(left)

    # -- steps -----------------------------------------------------------------

    def suspend(self) -> None:
        pods = [p for p in self._all_pods() if not p.terminating]
        for pod in pods:
            self.plan.delete(pod)
        if self.prior_phase is not Phase.SUSPENDED:
            self.plan.event(
                EventType.NORMAL,
                EventReason.SUSPENDED,
                f"job suspended; deleting {len(pods)} pod(s)",
            )
        self.s["phase"] = Phase.SUSPENDED.value
        for key in ("startTime", "belowMinSince", "backoffUntil"):
            self.s.pop(key, None)
        set_condition(
            self.conds,
            ConditionType.SUSPENDED,
            status=True,
            reason=Reason.SUSPENDED_BY_USER,
            message="spec.suspend is true",
            now=self.now,
        )

    def resume_if_needed(self) -> None:
        if self.prior_phase is Phase.SUSPENDED:
            self.plan.event(EventType.NORMAL, EventReason.RESUMED, "job resumed")
            set_condition(
                self.conds,
                ConditionType.SUSPENDED,
                status=False,
                reason=Reason.RESUMED,
                message="spec.suspend is false",
                now=self.now,
            )
            self.s["phase"] = Phase.PENDING.value
        self.s.setdefault("startTime", format_time(self.now))

    def account_failures(self) -> list[PodView]:
        """Count each failed worker once (by UID, remembered in status); return them."""
        accounted: list[str] = list(self.s.get("accountedPods") or [])
        failed = [w for w in self.workers if w.phase == "Failed"]
        fresh = 0
        for pod in failed:
            if pod.uid in accounted:
                continue
            accounted.append(pod.uid)
            failure = classify(pod, self.obs)
            if failure.reason is Reason.POD_DELETED or pod.exit_code == ExitCode.RENDEZVOUS_CLOSED:
                continue  # deleted on purpose (already reported), or found the job closed
            fresh += 1
            if failure.fatal:
                self.fatal = f"pod {pod.name}: {failure.message[-300:]}"
            self.s["replacements"] = int(self.s.get("replacements", 0)) + 1
            if failure.counted:
                self.s["failures"] = int(self.s.get("failures", 0)) + 1
            self.plan.replacements.append(failure.reason)
            code = "" if failure.exit_code is None else f" (exit code {failure.exit_code})"
            counted = "counted" if failure.counted else "not counted"
            self.s["lastFailure"] = {
                "pod": pod.name,
                "reason": failure.reason.value,
                "exitCode": failure.exit_code,
                "counted": failure.counted,
                "message": failure.message[-1024:],
                "time": format_time(self.now),
            }
            self.plan.event(
                EventType.WARNING,
                failure.event_reason,
                f"pod {pod.name} ended: {failure.reason.value}{code}, {counted} "
                f"against backoffLimit; {failure.message[-200:]}".rstrip("; "),
            )
        # Forget UIDs of pods that are gone: the list stays bounded by live pods.
        live = {p.uid for p in self.obs.pods}
        self.s["accountedPods"] = [u for u in accounted if u in live][
            -self.settings.accounted_pods_kept :
        ]
        if fresh and not self.fatal:  # a fatal failure ends the job: nothing is replaced
            last = self._since("lastReplacementTime")
            streak = int(self.s.get("replacementStreak", 0))
            streak = (
                streak + 1 if last is not None and last < 2 * self.settings.backoff_cap_s else 1
            )
            delay = backoff_delay(streak, self.settings)
            self.s["replacementStreak"] = streak
            self.s["lastReplacementTime"] = format_time(self.now)
            self.s["backoffUntil"] = format_time(self.now + dt.timedelta(seconds=delay))
            self.plan.event(
                EventType.NORMAL,
                EventReason.BACKING_OFF,
                f"replacing failed pods in {delay:.0f}s (replacement streak {streak})",
            )
        return failed

    def replace_failed(self, failed: list[PodView]) -> None:
        for pod in failed:
            if not pod.terminating:
                self.plan.delete(pod)
                self.plan.event(
                    EventType.NORMAL,
                    EventReason.REPLACED_POD,
                    f"deleting failed pod {pod.name} to replace it",
                )

    def scale(self, held: bool = False) -> pacing.Budget | None:
        """Scale toward ``desiredReplicas`` (``held``: a refused create waits); the budget used."""
        job = self.job
        desired = job.desired
        prior_desired = self.s.get("desiredReplicas")
        if isinstance(prior_desired, int) and prior_desired != desired:
            up = desired > prior_desired
            self.plan.event(
                EventType.NORMAL,
                EventReason.SCALED_UP if up else EventReason.SCALED_DOWN,
                f"desired replicas {prior_desired} -> {desired}",
            )
        self.s["desiredReplicas"] = desired
        active = [w for w in self.workers if w.active]
        if len(active) > desired:
            # Pending pods first (they hold no training state), then out-of-date
            # ones (they would be rolled anyway), then highest indices.
            current = builders.template_hash(job)
            victims = sorted(
                active,
                key=lambda w: (w.running, not rollout.outdated(w, current), -(w.index or 0)),
            )
            for pod in victims[: len(active) - desired]:
                self.plan.delete(pod)
            return None
        missing = desired - len(active)
        if missing <= 0 or held:
            return None
        until = self._time("backoffUntil")
        if until is not None and until > self.now:
            self.plan.wake_in((until - self.now).total_seconds())
            return None
        # At most maxReplicas worker objects, one pod per index, paced (pacing.py).
        budget = pacing.budget(self.workers, self.settings)
        occupied = {w.index for w in self.workers}
        room = job.max_replicas - len(self.workers)
        take = min(missing, room, budget.allowed)
        free = [i for i in range(job.max_replicas) if i not in occupied][:take]
        for index in free:
            self.plan.create_pods.append(builders.worker_pod(job, index, self.settings))
        if free:
            names = ", ".join(labels.worker_pod_name(job.name, i) for i in free)
            self.plan.event(EventType.NORMAL, EventReason.CREATED_POD, f"created {names}")
        return budget

    def roll(self) -> None:
        """Replace workers built from an older spec (see ``rollout.step``)."""
        until = self._time("backoffUntil")
        victims, left = rollout.step(
            self.job,
            self.workers,
            busy=bool(self.plan.delete_pods),  # scale-down or failures in this very pass
            backing_off=until is not None and until > self.now,
        )
        for pod in victims:
            self.plan.delete(pod)
        if victims:
            self.plan.event(
                EventType.NORMAL,
                EventReason.ROLLING_UPDATE,
                f"job spec changed: replacing {', '.join(w.name for w in victims)}; "
                f"{left} running worker(s) left on the old spec",
            )

    def rendezvous_host(self, held: bool = False) -> None:
        job = self.job
        host = backends.host(job)
        if host is None:  # the user's own store: nothing to run
            return
        role, name = host.role, host.pod_name
        pods = [p for p in self.obs.role(role) if p.name == name]
        for pod in pods:
            if pod.finished and not pod.terminating:
                self.plan.delete(pod)
        if pods or held:
            return
        if self.s.get("rendezvousHost"):
            self.plan.event(
                EventType.WARNING,
                EventReason.RENDEZVOUS_HOST_LOST,
                f"rendezvous host {name} was lost; recreating it (agents re-rendezvous)",
            )
        else:
            self.plan.event(EventType.NORMAL, EventReason.STORE_CREATED, f"created {name}")
        self.s["rendezvousHost"] = name
        self.plan.create_pods.append(host.build(job, self.settings))

    def ensure_services(self) -> None:
        for svc in builders.services(self.job):
            if svc["metadata"]["name"] not in self.obs.services:
                self.plan.create_services.append(svc)

    def ensure_network_policy(self) -> None:
        """Keep the job's NetworkPolicy while enabled, delete it once opted out."""
        name = netpol.policy_name(self.job.name)
        present = name in self.obs.network_policies
        if self.job.network_policy and not present:
            self.plan.create_network_policies.append(netpol.network_policy(self.job, self.settings))
        elif not self.job.network_policy and present:
            self.plan.delete_network_policies.append(name)

    def availability(self) -> None:
        job = self.job
        running = sum(1 for w in self.workers if w.running)
        if running >= job.min_replicas:
            self.s.pop("belowMinSince", None)
            self.s["phase"] = Phase.RUNNING.value
            set_condition(
                self.conds,
                ConditionType.MIN_AVAILABLE,
                status=True,
                reason=Reason.MIN_REPLICAS_RUNNING,
                message=f"{running} of minimum {job.min_replicas} workers running",
                now=self.now,
            )
            return
        self.s.setdefault("belowMinSince", format_time(self.now))
        below = self._since("belowMinSince") or 0.0
        was_running = self.prior_phase in (Phase.RUNNING, Phase.RESTARTING)
        self.s["phase"] = (Phase.RESTARTING if was_running else Phase.PENDING).value
        message = f"{running} of minimum {job.min_replicas} workers running"
        set_condition(
            self.conds,
            ConditionType.MIN_AVAILABLE,
            status=False,
            reason=Reason.BELOW_MIN_REPLICAS,
            message=message,
            now=self.now,
        )
        left = job.min_available_timeout_s - below
        if left <= 0:
            self.finish(
                Phase.FAILED,
                Reason.MIN_AVAILABLE_TIMEOUT,
                f"{message} for over minAvailableTimeoutSeconds={job.min_available_timeout_s}",
            )
        else:
            self.plan.wake_in(left)

    def counts(self) -> None:
        active = [w for w in self.workers if w.active]
        self.s["replicas"] = len(active)
        self.s["readyReplicas"] = sum(1 for w in active if w.ready)
        current = builders.template_hash(self.job)
        self.s["updatedReplicas"] = sum(1 for w in active if not rollout.outdated(w, current))
        self.s["selector"] = labels.worker_selector(self.job.name)
        self.s["observedGeneration"] = self.job.generation
        for key in ("failures", "replacements", "restarts"):
            self.s.setdefault(key, 0)
        # Finished members' final reports count: a job done between polls keeps its world size.
        names = {w.name for w in self.workers if w.active or succeeded(w)}
        reports = [r for n, r in self.obs.reports.items() if n in names and r.round >= 0]
        if reports:
            rnd = max(r.round for r in reports)
            self.s["rendezvousRound"] = rnd
            self.s["worldSize"] = max(r.world_size for r in reports if r.round == rnd)
            self.s["restarts"] = max(int(self.s["restarts"]), *(r.restarts for r in reports))
        self.s.setdefault("worldSize", 0)
        self.s.setdefault("rendezvousRound", -1)


def plan(
    job: JobSpec,
    status: Mapping[str, Any],
    observed: Observed,
    now: dt.datetime,
    settings: Settings | None = None,
) -> Plan:
    """Decide everything one reconcile pass does for ``job``; pure."""
    p = _Pass(job, status, observed, now, settings or Settings())
    result = p.plan
    if job.deleting:
        return result  # the garbage collector owns teardown
    if p.prior_phase is not None and p.prior_phase.finished:
        p.cleanup()
    elif job.suspend:
        p.suspend()
    else:
        p.resume_if_needed()
        failed = p.account_failures()
        verdicts.force_delete_stuck(p)
        deadline = job.active_deadline_s
        started = p._since("startTime") or 0.0
        verdict = completion.judge(p.workers, observed.reports)
        outcome = None if verdict is None else verdict.outcome
        if verdict is not None and outcome is completion.Outcome.SUCCEEDED:
            p.finish(Phase.SUCCEEDED, Reason.WORKER_GROUP_SUCCEEDED, verdict.message)
        elif verdict is not None and outcome is completion.Outcome.FAILED:
            p.finish(Phase.FAILED, Reason.FINAL_ROUND_INCOMPLETE, verdict.message)
        elif p.fatal:
            p.finish(Phase.FAILED, Reason.BAD_COMMAND, p.fatal)
        elif int(p.s.get("failures", 0)) > job.backoff_limit:
            last = p.s.get("lastFailure") or {}
            p.finish(
                Phase.FAILED,
                Reason.BACKOFF_LIMIT_EXCEEDED,
                f"{p.s['failures']} counted failures > backoffLimit={job.backoff_limit}; last: "
                f"{last.get('pod')} {last.get('reason')} exit {last.get('exitCode')}: "
                f"{str(last.get('message', ''))[-300:]}",
            )
        elif deadline is not None and started >= deadline:
            p.finish(
                Phase.FAILED,
                Reason.DEADLINE_EXCEEDED,
                f"running longer than activeDeadlineSeconds={deadline}",
            )
        elif verdict is not None:  # completing: the rest of the final round may still work
            if deadline is not None:
                result.wake_in(deadline - started)
            verdicts.complete(p, verdict)
        else:
            if deadline is not None:
                result.wake_in(deadline - started)
            p.replace_failed(failed)
            verdicts.fence(p)
            held = verdicts.refusals(p)
            if not Phase(p.s.get("phase", Phase.PENDING)).finished:
                p.availability()
            if not Phase(p.s["phase"]).finished:
                verdicts.store_liveness(p)
                p.rendezvous_host(held)
                p.ensure_services()
                p.ensure_network_policy()
                budget = p.scale(held)
                p.roll()
                verdicts.desired_size(p, budget, held)
        if Phase(p.s["phase"]).finished:
            p.cleanup()
        else:
            result.wake_in(p.settings.resync_s)
    p.counts()
    decided = [(e.type.value, e.reason.value, e.message) for e in result.events]
    events.settle(p.s, status, decided, observed.posted_events)
    result.status = p.s
    return result
