"""The pure reconcile: ``plan(job, status, observed, now) -> Plan``.

Where it sits: the heart of the operator. ``reconciler`` observes, parses the
job (``JobSpec``) and its status (``JobStatus``), calls ``plan`` and hands the
result to ``apply``; nothing here touches the API or the clock, so every
decision is table-tested (tests/unit/operator). One pass looks at the whole
observed state of one job (level-triggered) and decides: pods and Services
to create, pods to delete (gracefully, or forced off a lost node), the
complete new status (a ``JobStatus``: typed fields, datetimes, no strings
until the reconciler writes it), Events, and when to look again.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

from torchflex_contract import labels
from torchflex_contract.exit_codes import ExitCode
from torchflex_operator.model.observed import Observed, PodView
from torchflex_operator.model.plan import Plan
from torchflex_operator.model.settings import Settings
from torchflex_operator.model.spec import JobSpec
from torchflex_operator.model.status import Condition, JobStatus, LastFailure
from torchflex_operator.model.vocabulary import ConditionType, EventReason, EventType, Phase, Reason
from torchflex_operator.planning.rules import completion, conditions, events, pacing, rollout
from torchflex_operator.planning.rules.failures import classify, final_report, root_cause, succeeded
from torchflex_operator.planning.steps import lifecycle, spares, training, verdicts
from torchflex_operator.render import backends, builders, netpol, podgroup


class _Pass:
    """State of one planning pass; methods are its steps, in order (``run``).

    ``s`` is the status being decided: a frozen ``JobStatus`` each step
    replaces (``dataclasses.replace``). The steps in ``verdicts`` read and
    replace it the same way, through the attributes and helpers below.
    """

    def __init__(
        self,
        job: JobSpec,
        prior: JobStatus,
        observed: Observed,
        now: dt.datetime,
        settings: Settings,
    ) -> None:
        if observed.queue is not None and not observed.queue.holds:
            # Kueue admitted this many workers: the job runs at most at that size.
            job = replace(job, replicas=min(job.desired, observed.queue.count))
        self.job = job
        self.prior = prior
        self.obs = observed
        self.now = now
        self.stamp = now.replace(microsecond=0)
        """``now`` as the status records it: whole seconds, like the string it becomes."""
        self.settings = settings
        self.plan = Plan()
        # A planned status always carries its conditions list, empty or not.
        self.s = replace(prior, conditions=prior.conditions or ())
        self.prior_phase = prior.phase
        everyone = observed.workers()
        self.workers = [w for w in everyone if not w.standby]
        """The members: every worker pod but the warm spares."""
        self.spares = [w for w in everyone if w.standby]
        """Warm spares (``spares``): never counted as members, in status or verdicts."""
        self.fatal = ""  # set by account_failures: a failure retrying cannot help

    # -- helpers -------------------------------------------------------------

    def since(self, when: dt.datetime | None) -> float | None:
        """Seconds from ``when`` to now; None for no time."""
        return None if when is None else (self.now - when).total_seconds()

    @property
    def finished(self) -> bool:
        return self.s.phase is not None and self.s.phase.finished

    def condition(self, ctype: ConditionType) -> Condition | None:
        return conditions.get_condition(self.s.conditions or (), ctype)

    def set_condition(
        self, ctype: ConditionType, *, status: bool, reason: Reason, message: str
    ) -> None:
        conds = conditions.set_condition(
            self.s.conditions or (),
            ctype,
            status=status,
            reason=reason,
            message=message,
            now=self.stamp,
            generation=self.job.generation,
        )
        self.s = replace(self.s, conditions=conds)

    # -- terminal handling -----------------------------------------------------

    def finish(self, phase: Phase, reason: Reason, message: str) -> None:
        self.s = replace(
            self.s,
            phase=phase,
            completion_time=self.stamp,
            below_min_since=None,
            backoff_until=None,
        )
        ctype = ConditionType.SUCCEEDED if phase is Phase.SUCCEEDED else ConditionType.FAILED
        self.set_condition(ctype, status=True, reason=reason, message=message)
        if phase is Phase.SUCCEEDED:  # batch/v1's word for it (docs/api.md, Conditions)
            self.set_condition(ConditionType.COMPLETE, status=True, reason=reason, message=message)
        etype = EventType.NORMAL if phase is Phase.SUCCEEDED else EventType.WARNING
        ereason = EventReason.SUCCEEDED if phase is Phase.SUCCEEDED else EventReason.FAILED
        self.plan.event(etype, ereason, f"{reason.value}: {message}")

    # -- steps -----------------------------------------------------------------

    def account_failures(self) -> list[PodView]:
        """Count each failed worker once (by UID, remembered in status); return them."""
        accounted = list(self.s.accounted_pods or ())
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
            failures = self.s.failures or 0
            shown = None if self.s.last_failure is None else self.s.last_failure.root_cause
            cause = root_cause(pod.name, final_report(pod.message), shown)
            message = failure.message
            if cause is not None and f"{cause.type}: {cause.message}" not in message:
                # The agent's message may predate root causes: name the exception anyway.
                message = f"{message}; {cause.type}: {cause.message}".lstrip("; ")
            self.s = replace(
                self.s,
                replacements=(self.s.replacements or 0) + 1,
                failures=failures + 1 if failure.counted else self.s.failures,
                last_failure=LastFailure(
                    pod=pod.name,
                    reason=failure.reason.value,
                    exit_code=failure.exit_code,
                    counted=failure.counted,
                    message=message[-1024:],
                    time=self.stamp,
                    root_cause=cause,
                ),
            )
            self.plan.replacements.append(failure.reason)
            code = "" if failure.exit_code is None else f" (exit code {failure.exit_code})"
            counted = "counted" if failure.counted else "not counted"
            self.plan.event(
                EventType.WARNING,
                failure.event_reason,
                f"pod {pod.name} ended: {failure.reason.value}{code}, {counted} "
                f"against backoffLimit; {failure.message[-200:]}".rstrip("; "),
            )
        # Forget UIDs of pods that are gone: the list stays bounded by live pods.
        live = {p.uid for p in self.obs.pods}
        kept = [u for u in accounted if u in live][-self.settings.accounted_pods_kept :]
        self.s = replace(self.s, accounted_pods=tuple(kept))
        if fresh and not self.fatal:  # a fatal failure ends the job: nothing is replaced
            self.back_off()
        return failed

    def back_off(self) -> None:
        """Hold replacements back: 1, 2, 4, ... s while failures keep coming (``pacing``)."""
        last = self.since(self.s.last_replacement_time)
        streak = self.s.replacement_streak or 0
        streak = streak + 1 if last is not None and last < 2 * self.settings.backoff_cap_s else 1
        delay = pacing.backoff_delay(streak, self.settings)
        until = self.now + dt.timedelta(seconds=delay)
        self.s = replace(
            self.s,
            replacement_streak=streak,
            last_replacement_time=self.stamp,
            backoff_until=until.replace(microsecond=0),
        )
        self.plan.event(
            EventType.NORMAL,
            EventReason.BACKING_OFF,
            f"replacing failed pods in {delay:.0f}s (replacement streak {streak})",
        )

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
        prior_desired = self.s.desired_replicas
        if prior_desired is not None and prior_desired != desired:
            up = desired > prior_desired
            self.plan.event(
                EventType.NORMAL,
                EventReason.SCALED_UP if up else EventReason.SCALED_DOWN,
                f"desired replicas {prior_desired} -> {desired}",
            )
        self.s = replace(self.s, desired_replicas=desired)
        active = [w for w in self.workers if w.active]
        if len(active) > desired:
            # Members in the warm spares' range first (spares live there), then
            # pending pods (they hold no training state), then out-of-date ones
            # (they would be rolled anyway), then highest indices.
            current = builders.template_hash(job)
            victims = sorted(
                active,
                key=lambda w: (
                    not (job.warm_spares and (w.index or 0) >= desired),
                    w.running,
                    not rollout.outdated(w, current),
                    -(w.index or 0),
                ),
            )
            for pod in victims[: len(active) - desired]:
                self.plan.delete(pod)
            return None
        missing = desired - len(active)
        if missing <= 0 or held:
            return None
        until = self.s.backoff_until
        if until is not None and until > self.now:
            self.plan.wake_in((until - self.now).total_seconds())
            return None
        # At most maxReplicas worker objects, one pod per index, paced (pacing.py).
        budget = pacing.budget(
            self.workers, self.settings, podgroup.pods_at_once(job, self.settings)
        )
        occupied = {w.index for w in (*self.workers, *self.spares)}
        room = job.max_replicas - len(self.workers) - len(self.spares)
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
        until = self.s.backoff_until
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
        if self.s.rendezvous_host:
            self.plan.event(
                EventType.WARNING,
                EventReason.RENDEZVOUS_HOST_LOST,
                f"rendezvous host {name} was lost; recreating it (agents re-rendezvous)",
            )
        else:
            self.plan.event(EventType.NORMAL, EventReason.STORE_CREATED, f"created {name}")
        self.s = replace(self.s, rendezvous_host=name)
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
            self.s = replace(self.s, below_min_since=None, phase=Phase.RUNNING)
            self.set_condition(
                ConditionType.MIN_AVAILABLE,
                status=True,
                reason=Reason.MIN_REPLICAS_RUNNING,
                message=f"{running} of minimum {job.min_replicas} workers running",
            )
            return
        began = self.s.below_min_since or self.stamp
        below = self.since(began) or 0.0
        was_running = self.prior_phase in (Phase.RUNNING, Phase.RESTARTING)
        phase = Phase.RESTARTING if was_running else Phase.PENDING
        self.s = replace(self.s, below_min_since=began, phase=phase)
        message = f"{running} of minimum {job.min_replicas} workers running"
        self.set_condition(
            ConditionType.MIN_AVAILABLE,
            status=False,
            reason=Reason.BELOW_MIN_REPLICAS,
            message=message,
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
        current = builders.template_hash(self.job)
        restarts = self.s.restarts or 0
        rnd = -1 if self.s.rendezvous_round is None else self.s.rendezvous_round
        world = self.s.world_size or 0
        # Finished members' final reports count: a job done between polls keeps its
        # world size, and a failed one the restarts and round its agents ended with.
        names = {w.name for w in self.workers if w.active or succeeded(w) or w.phase == "Failed"}
        reports = [r for n, r in self.obs.reports.items() if n in names and r.round >= 0]
        if reports:
            rnd = max(r.round for r in reports)
            world = max(r.world_size for r in reports if r.round == rnd)
            restarts = max(restarts, *(r.restarts for r in reports))
        self.s = replace(
            self.s,
            replicas=len(active),
            ready_replicas=sum(1 for w in active if w.ready),
            updated_replicas=sum(1 for w in active if not rollout.outdated(w, current)),
            selector=labels.worker_selector(self.job.name),
            observed_generation=self.job.generation,
            failures=self.s.failures or 0,
            replacements=self.s.replacements or 0,
            restarts=restarts,
            rendezvous_round=rnd,
            world_size=world,
            warm_spares=(
                sum(1 for w in self.spares if w.running)
                if self.job.warm_spares or self.spares
                else None
            ),
        )

    def decide(self) -> None:
        """The steps of a job that is neither finished nor suspended, in order."""
        job, result = self.job, self.plan
        lifecycle.resume(self)
        failed = self.account_failures()
        verdicts.force_delete_stuck(self)
        deadline = job.active_deadline_s
        started = self.since(self.s.start_time) or 0.0
        verdict = completion.judge(self.workers, self.obs.reports)
        outcome = None if verdict is None else verdict.outcome
        failures = self.s.failures or 0
        if verdict is not None and outcome is completion.Outcome.SUCCEEDED:
            self.finish(Phase.SUCCEEDED, Reason.WORKER_GROUP_SUCCEEDED, verdict.message)
        elif verdict is not None and outcome is completion.Outcome.FAILED:
            self.finish(Phase.FAILED, Reason.FINAL_ROUND_INCOMPLETE, verdict.message)
        elif self.fatal:
            self.finish(Phase.FAILED, Reason.BAD_COMMAND, self.fatal)
        elif failures > job.backoff_limit:
            last = self.s.last_failure
            pod, why, code, text = (
                (None, None, None, "")
                if last is None
                else (last.pod, last.reason, last.exit_code, last.message)
            )
            self.finish(
                Phase.FAILED,
                Reason.BACKOFF_LIMIT_EXCEEDED,
                f"{failures} counted failures > backoffLimit={job.backoff_limit}; last: "
                f"{pod} {why} exit {code}: {text[-300:]}",
            )
        elif deadline is not None and started >= deadline:
            self.finish(
                Phase.FAILED,
                Reason.DEADLINE_EXCEEDED,
                f"running longer than activeDeadlineSeconds={deadline}",
            )
        elif verdict is not None:  # completing: the rest of the final round may still work
            if deadline is not None:
                result.wake_in(deadline - started)
            verdicts.complete(self, verdict)
            spares.retire(self)
        else:
            if deadline is not None:
                result.wake_in(deadline - started)
            spares.promote(self)
            self.replace_failed(failed)
            verdicts.fence(self)
            held = verdicts.refusals(self)
            if not self.finished:
                self.availability()
            if not self.finished:
                training.training(self)
                verdicts.store_liveness(self)
                self.rendezvous_host(held)
                self.ensure_services()
                self.ensure_network_policy()
                budget = self.scale(held)
                self.roll()
                spares.keep(self, held)
                verdicts.desired_size(self, budget, held)
        if self.finished:
            lifecycle.cleanup(self)
            spares.retire(self)
        else:
            if verdict is not None:  # completing: the agents' reports say who still trains
                training.training(self)
            result.wake_in(self.settings.resync_s)

    def run(self) -> Plan:
        if self.job.deleting:
            return self.plan  # the garbage collector owns teardown; no status to write
        if self.prior_phase is not None and self.prior_phase.finished:
            lifecycle.cleanup(self)
            spares.retire(self)
        elif self.job.suspend:
            lifecycle.suspend(self)
        elif self.obs.queue is not None and self.obs.queue.holds:
            lifecycle.hold(self, self.obs.queue)
        else:
            self.decide()
        if self.obs.queue is not None and not self.finished and not self.job.suspend:
            # Kueue's word is re-read this often (``queueing.must_read``).
            self.plan.wake_in(self.settings.queue_poll_s)
        if self.finished:
            phase = self.s.phase.value.lower() if self.s.phase else ""
            training.idle(self, Reason.JOB_FINISHED, f"the job {phase}; nothing runs")
        elif self.s.phase is Phase.SUSPENDED:
            training.idle(self, *lifecycle.why_suspended(self))
        # Every condition was weighed against this spec, kept or changed (metav1.Condition).
        gen = self.job.generation
        conds = tuple(replace(c, observed_generation=gen) for c in self.s.conditions or ())
        self.s = replace(self.s, conditions=conds)
        self.counts()
        training.progress(self)
        decided = [(e.type, e.reason.value, e.message) for e in self.plan.events]
        self.s = events.settle(self.s, self.prior, decided, self.obs.posted_events)
        training.bound_progress(self)
        self.plan.status = self.s
        return self.plan


def plan(
    job: JobSpec,
    status: JobStatus,
    observed: Observed,
    now: dt.datetime,
    settings: Settings | None = None,
) -> Plan:
    """Decide everything one reconcile pass does for ``job``; pure."""
    return _Pass(job, status, observed, now, settings or Settings()).run()
