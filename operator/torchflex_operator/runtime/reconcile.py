"""One reconcile pass per job: observe, plan, apply; and the workers that run them.

Where it sits: between kopf (``handlers`` feed the caches and the queue) and
the API (``kube``). ``Reconciler.reconcile`` takes the job and its pods from
the watch-fed caches, overlays expectations, parses the job's spec and
status (``JobSpec``, ``JobStatus``), calls the pure ``planner.plan`` and
applies the result: status first (serialised once and patched only where it
differs from what the API holds; it carries the failure bookkeeping, guarded
by resourceVersion), then Services, pod creates and deletes, then Events. A
pass that changes nothing makes no API request, so the slow resync
(``--resync``) of an idle job is free. The first pass of a job after start
or takeover reads the job and its pods from the API once (the watches may
not have delivered them yet, and a standby's cache is stale); so does
the pass after a status write was refused as stale (409). Workers wait on
the ``leader`` gate: a standby replica takes no key and writes nothing.
Gang scheduling (``gang``): the first pass of the process asks API discovery
whether PodGroups are served and keeps the answer in ``settings``; where
they are, a live job's PodGroup is written before anything else of the pass,
once per process and again when ``minReplicas`` changes. The job's
PodDisruptionBudget (``disruption``) is written the same way, and deleted
once when the job has finished.
Kueue (``queueing``, ``admission``): a job labelled with a queue name is
planned with what its Workload allows; after the pass its Workload is
created, released or marked Finished.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from torchflex_contract import labels
from torchflex_operator.kube import Kube
from torchflex_operator.model.errors import (
    AccessDeniedError,
    ApiAbsentError,
    ConflictError,
    InvalidSpecError,
    NotOursError,
    PermanentError,
    RefusedError,
    RetryableError,
)
from torchflex_operator.model.observed import Observed, PodView, Refusal
from torchflex_operator.model.plan import Plan
from torchflex_operator.model.settings import Settings
from torchflex_operator.model.spec import JobSpec
from torchflex_operator.model.status import JobStatus
from torchflex_operator.model.vocabulary import EventReason, EventType, GangScheduling
from torchflex_operator.planning.pipeline import plan
from torchflex_operator.planning.rules import events
from torchflex_operator.planning.rules.defaulting import replicas_patch
from torchflex_operator.render import pdb, podgroup, workload
from torchflex_operator.runtime.admission import Workloads
from torchflex_operator.runtime.agent_status import StatusPoller
from torchflex_operator.runtime.cache import JobKey, NodeCache, OwnedCache
from torchflex_operator.runtime.expectations import TIMEOUT as EXPECTATION_TIMEOUT
from torchflex_operator.runtime.expectations import Expectations
from torchflex_operator.runtime.leader import Gate
from torchflex_operator.runtime.logsetup import CURRENT_JOB
from torchflex_operator.runtime.metrics import Metrics
from torchflex_operator.runtime.workqueue import WorkQueue, cancel_all

log = logging.getLogger(__name__)
# A withdrawn ClusterRoleBinding refuses every job at once: say it once per this
# many seconds, not once per job and pass (helm uninstall does exactly this).
DENIED_WARN_EVERY_S = 300.0
RIGHTS_WITHDRAWN = "operator rights withdrawn"


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


class Reconciler:
    def __init__(
        self,
        kube: Kube,
        settings: Settings,
        *,
        poller: StatusPoller | None = None,
        metrics: Metrics | None = None,
        workers: int = 4,
        clock: Callable[[], dt.datetime] = utcnow,
        gate: Gate | None = None,
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.poller = poller or StatusPoller(enabled=False)
        # Its long poll on a job's rank-0 agent wakes the job when the group
        # re-forms: status follows a scale within a round trip, not a poll interval.
        self.poller.on_change = self.enqueue
        self.metrics = metrics or Metrics()
        self.cache = OwnedCache()
        self.nodes = NodeCache()
        self.expectations = Expectations()
        self.queue: WorkQueue[JobKey] = WorkQueue()
        self.clock = clock
        self.gate = gate or Gate()
        self.gate.on_change = self._gate_changed
        self.jobs: dict[JobKey, dict[str, Any]] = {}
        """Latest ElasticJob objects from the watch (or our own status writes)."""
        self._synced: set[JobKey] = set()
        self._workers = workers
        self._tasks: list[asyncio.Task[None]] = []
        self._failures: dict[JobKey, int] = {}
        self._refusals: dict[JobKey, dict[str, Refusal]] = {}
        """Latest refused create per job and object name (cleared by a create that works)."""
        self._posted: dict[JobKey, set[int]] = {}
        """Ids of the job's ``status.pendingEvents`` posted by this process."""
        self._denied_warned_at: float | None = None
        self._gangs: dict[JobKey, int] = {}
        """The gang ``minCount`` this process wrote to each job's PodGroup (``gang``)."""
        self._budgets: dict[JobKey, int | None] = {}
        """The ``minAvailable`` this process wrote to each job's PodDisruptionBudget (None:
        deleted, the job finished)."""
        self._budget_spares: dict[JobKey, bool] = {}
        """Whether that budget's selector leaves warm spares out (``disruption``)."""
        self._budget_refused: dict[JobKey, str] = {}
        """The last reason a job's budget could not be written (said once in an Event)."""
        self.workloads = Workloads(kube, settings.queue_poll_s)
        self._gang_asked = asyncio.Lock()
        """Held while discovery is asked: the workers' first passes ask once between them."""
        self.metrics.instrument(self.queue, lambda: self.jobs if self.gate.active else {})

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        self.metrics.active.set(1 if self.gate.active else 0)
        self.gate.start()
        for n in range(self._workers):
            self._tasks.append(asyncio.create_task(self._worker(), name=f"reconcile-{n}"))

    async def stop(self) -> None:
        await self.gate.stop()
        await cancel_all(self._tasks)
        await self.poller.close()

    def enqueue(self, key: JobKey, delay: float = 0.0) -> None:
        self.queue.add(key, delay)

    def job_seen(self, key: JobKey, obj: Mapping[str, Any]) -> None:
        """A job from the watch: cache it and wake its reconcile."""
        self.jobs[key] = dict(obj)
        self.enqueue(key)

    def forget(self, key: JobKey) -> None:
        self.queue.discard(key)
        self.cache.forget(key)
        self.jobs.pop(key, None)
        self._synced.discard(key)
        self.expectations.forget(key)
        self.poller.forget(key)
        self.metrics.job_phase(key, None)
        self._failures.pop(key, None)
        self._refusals.pop(key, None)
        self._posted.pop(key, None)
        self._gangs.pop(key, None)
        self._budgets.pop(key, None)
        self._budget_spares.pop(key, None)
        self._budget_refused.pop(key, None)
        self.workloads.forget(key)

    def _gate_changed(self, active: bool) -> None:
        self.metrics.active.set(1 if active else 0)
        if active:
            # Taking over: what we cached as a standby may be stale (kopf's watches
            # were paused). Each job's first pass re-reads it and its pods.
            self._synced.clear()
            for key in list(self.jobs):
                self.enqueue(key)

    async def _worker(self) -> None:
        while True:
            await self.gate.wait_active()
            key = await self.queue.get()
            if not self.gate.active:  # lost the lead while waiting: leave it queued
                self.queue.done(key)
                self.queue.add(key)
                continue
            started = time.perf_counter()
            CURRENT_JOB.set(key)  # log records of this pass name the job (logsetup)
            try:
                requeue = await self.reconcile(key)
            except RetryableError as exc:
                n = self._failures.get(key, 0) + 1
                self._failures[key] = n
                delay = exc.retry_after or min(30.0, 0.2 * 2**n)
                log.info("reconcile %s/%s: %s; retrying in %.1fs", *key, exc, delay)
                self.metrics.reconciles.labels("retry").inc()
                self.queue.add(key, delay)
            except AccessDeniedError as exc:
                self._rights_refused(key, exc)
                self.metrics.reconciles.labels("denied").inc()
                self.queue.add(key, self.settings.resync_s)
            except PermanentError as exc:
                log.error("reconcile %s/%s: %s", *key, exc)
                self.metrics.reconciles.labels("error").inc()
                self.queue.add(key, self.settings.resync_s)
            except Exception:  # a bug: keep the operator alive, retry slowly
                log.exception("reconcile %s/%s crashed", *key)
                self.metrics.reconciles.labels("crash").inc()
                self.queue.add(key, 30.0)
            else:
                self._failures.pop(key, None)
                self.metrics.reconciles.labels("ok").inc()
                if requeue is not None:
                    self.queue.add(key, requeue)
            finally:
                self.metrics.latency.observe(time.perf_counter() - started)
                self.queue.done(key)
                CURRENT_JOB.set(None)

    def _rights_refused(self, key: JobKey, exc: AccessDeniedError) -> None:
        """RBAC refused us: one warning per ``DENIED_WARN_EVERY_S``, the rest at debug.

        The job is left exactly as it is (nothing half-applied matters: the next
        pass plans from the whole observed state again) and retried at the slow
        resync, so rights that come back (a re-install) resume reconciling.
        """
        now = time.monotonic()
        last = self._denied_warned_at
        if last is not None and now - last < DENIED_WARN_EVERY_S:
            log.debug("reconcile %s/%s: %s", *key, exc)
            return
        self._denied_warned_at = now
        log.warning(
            "%s: %s. Jobs are left as they are and retried every %.0fs; this is expected "
            "while `helm uninstall` removes the release (its RBAC can go before this pod "
            "stops), otherwise check the operator's ClusterRole/Role bindings",
            RIGHTS_WITHDRAWN,
            exc,
            self.settings.resync_s,
        )

    # -- one pass -------------------------------------------------------------------

    async def observe(self, key: JobKey, now: dt.datetime) -> Observed:
        pods = self.expectations.overlay(
            key, self.cache.job_pods(key), now, self.cache.seen_uids(key)
        )
        reports = await self.poller.reports(key, pods)
        # A refusal is re-recorded on every refused retry (each refusal_retry_s);
        # one not renewed for three of those is about an object no longer wanted.
        stale = now - dt.timedelta(seconds=3 * self.settings.refusal_retry_s)
        refused = self._refusals.get(key, {})
        for name in [n for n, r in refused.items() if r.at < stale]:
            del refused[name]
        return Observed(
            pods=tuple(pods),
            services=self.cache.job_services(key),
            network_policies=self.cache.job_network_policies(key),
            node_ready=dict(self.nodes.ready),
            nodes_known=self.nodes.synced,
            reports=reports,
            unanswered=self.poller.unanswered(key),
            rounds_seen=self.poller.rounds_seen(key, pods, reports),
            refusals=dict(self._refusals.get(key, {})),
            posted_events=frozenset(self._posted.get(key, ())),
        )

    async def _sync(self, key: JobKey) -> dict[str, Any] | None:
        """Read the job and its pods from the API (first pass, or after a stale write)."""
        namespace, name = key
        mark = self.cache.mark()
        obj = await self.kube.get_job(namespace, name)
        if obj is None:
            return None
        selector = f"{labels.Label.JOB_NAME.value}={name}"
        pods = await self.kube.list_pods(namespace, selector)
        self.cache.merge_listed(key, pods, since=mark)
        self.jobs[key] = obj
        self._synced.add(key)
        return obj

    async def reconcile(self, key: JobKey) -> float | None:
        obj = self.jobs.get(key) if key in self._synced else await self._sync(key)
        if obj is None:
            self.forget(key)
            return None
        if (defaults := replicas_patch(obj)) is not None:
            # Absent spec.replicas breaks the scale subresource (defaulting.py).
            rv = str(obj["metadata"].get("resourceVersion", ""))
            try:
                obj = await self.kube.patch_job(*key, rv, defaults)
            except ConflictError:
                self._synced.discard(key)
                raise
            self.jobs[key] = obj
        now = self.clock()
        try:
            job = JobSpec.parse(obj)
        except InvalidSpecError as exc:
            await self._event(obj, EventType.WARNING, EventReason.INVALID_SPEC, str(exc), now)
            raise
        observed = await self.observe(key, now)
        view = await self.workloads.view(key, job)
        observed = dataclasses.replace(observed, queue=workload.gate(job, view))
        mode = await self._gang_mode()
        result = plan(job, JobStatus.parse(obj.get("status") or {}), observed, now, self.settings)
        if result.status is not None:  # None: the job is being deleted
            status = dataclasses.replace(result.status, gang_scheduling=mode)
            result = dataclasses.replace(result, status=status)
            phase = status.phase
            finished = phase is not None and phase.finished
            if mode is GangScheduling.ENABLED and not finished:
                await self._apply_gang(key, job)
            await self._apply_budget(key, obj, job, finished, now)
        await self.apply(key, obj, result, now)
        phase = None if result.status is None else result.status.phase
        await self.workloads.write(key, job, view, phase=phase, pods=len(observed.pods), now=now)
        self.metrics.job_phase(key, None if result.status is None else result.status.phase)
        requeue = result.requeue_after
        if self.poller.enabled and requeue is not None and any(p.running for p in observed.pods):
            # Agents' progress (world size, round) is only seen by asking again.
            requeue = min(requeue, self.poller.interval)
        if any(r.at == now for r in self._refusals.get(key, {}).values()):
            # A create was refused in this pass: say so in status at once.
            requeue = 1.0 if requeue is None else min(requeue, 1.0)
        if self.expectations.pending(key):
            # An expectation the watch never meets ends by timeout; make sure a
            # pass runs then, even if no event comes (no silent resync wait).
            wake = EXPECTATION_TIMEOUT.total_seconds() + 1.0
            requeue = wake if requeue is None else min(requeue, wake)
        return requeue

    async def _gang_mode(self) -> GangScheduling:
        """Whether the API serves PodGroups, asked once per process (``gang``)."""
        async with self._gang_asked:
            mode = self.settings.gang_scheduling
            if mode is None:
                mode = podgroup.mode(await self.kube.pod_groups_served())
                log.info("gang scheduling of each job's minimum: %s", mode.value)
                self.settings = dataclasses.replace(self.settings, gang_scheduling=mode)
            return mode

    async def _apply_gang(self, key: JobKey, job: JobSpec) -> None:
        """Create the job's PodGroup (before its pods: a pod naming a group that is not
        there waits) or bring its ``minCount`` to a changed ``minReplicas``."""
        if not podgroup.needs_write(job, self._gangs.get(key)):
            return
        try:
            await self.kube.apply_pod_group(podgroup.pod_group(job))
        except ApiAbsentError as exc:
            # Served at discovery, 404 now: the API was turned off, or the namespace
            # is going. Ask discovery again on the next pass, planned from its answer.
            self.settings = dataclasses.replace(self.settings, gang_scheduling=None)
            raise RetryableError(str(exc)) from exc
        self._gangs[key] = job.min_replicas

    async def _apply_budget(
        self, key: JobKey, obj: Mapping[str, Any], job: JobSpec, finished: bool, now: dt.datetime
    ) -> None:
        """Write the job's PodDisruptionBudget while it lives (again when ``minReplicas``
        changes); delete it once it has finished: no minimum to hold any more. A budget
        the API refuses, or one of that name the job does not own, is said in a Warning
        Event and the pass goes on: the job runs without it (tried again each pass)."""
        try:
            if finished:
                if key not in self._budgets or self._budgets[key] is not None:
                    await self.kube.delete_disruption_budget(
                        job.namespace, pdb.budget_name(job), job.uid
                    )
                    self._budgets[key] = None
            elif pdb.needs_write(job, self._budgets.get(key), self._budget_spares.get(key, False)):
                await self.kube.apply_disruption_budget(pdb.pod_disruption_budget(job))
                self._budgets[key] = job.min_replicas
                self._budget_spares[key] = bool(job.warm_spares)
                self._budget_refused.pop(key, None)
        except (NotOursError, RefusedError, AccessDeniedError) as exc:
            message = f"PodDisruptionBudget {pdb.budget_name(job)} not written: {exc}"
            log.warning("%s/%s: %s", *key, message)
            if self._budget_refused.get(key) != message and await self._event(
                obj, EventType.WARNING, EventReason.BUDGET_NOT_APPLIED, message, now
            ):
                self._budget_refused[key] = message

    async def apply(
        self, key: JobKey, obj: Mapping[str, Any], result: Plan, now: dt.datetime
    ) -> None:
        namespace, name = key
        status = JobStatus() if result.status is None else result.status
        # Serialised once, written once, and only when it differs from what the API holds.
        patch = {} if result.status is None else status.to_patch(obj.get("status") or {})
        if patch:
            rv = str(obj["metadata"].get("resourceVersion", ""))
            try:
                fresh = await self.kube.patch_job_status(namespace, name, rv, patch)
            except ConflictError:
                self._synced.discard(key)  # planned from a stale job: re-read, re-plan
                raise
            self.jobs[key] = fresh
        # The policy first: a job's store never listens unprotected.
        for policy in result.create_network_policies:
            await self.kube.create_network_policy(policy)
        for policy_name in result.delete_network_policies:
            await self.kube.delete_network_policy(namespace, policy_name)
        refused = self._refusals.setdefault(key, {})
        for svc in result.create_services:
            try:
                await self.kube.create_service(svc)
            except RefusedError as exc:
                refused[svc["metadata"]["name"]] = self._refused("Service", svc, exc, now)
                continue
            refused.pop(svc["metadata"]["name"], None)
        for manifest in result.create_pods:
            try:
                uid = await self.kube.create_pod(manifest)
            except RefusedError as exc:
                # Not this pass's failure: the next pass makes it a condition, an
                # Event, and fails the job if the refusal cannot go away.
                refused[manifest["metadata"]["name"]] = self._refused("Pod", manifest, exc, now)
                continue
            refused.pop(manifest["metadata"]["name"], None)
            view = PodView.from_pod(
                {**manifest, "metadata": {**manifest["metadata"], "uid": uid or ""}}
            )
            self.expectations.expect_created(key, view, now)
            if uid is not None:
                role = manifest["metadata"]["labels"][labels.Label.ROLE]
                self.metrics.pods_created.labels(role).inc()
        for spare in result.promote_pods:  # before creates' errors can cut the pass short
            await self.kube.set_pod_metadata(
                namespace,
                spare.name,
                spare.uid,
                new_labels={labels.Label.STANDBY.value: "false"},
                new_annotations={labels.Annotation.STANDBY.value: "false"},
            )
            self.expectations.expect_promoted(key, spare.uid, now)
        for reason in result.replacements:
            self.metrics.pods_replaced.labels(reason.value).inc()
        for victim in result.delete_pods:
            if await self.kube.delete_pod(
                namespace, victim.name, victim.uid, force=victim.force, grace_s=victim.grace_s
            ):
                self.metrics.pods_deleted.labels("force" if victim.force else "graceful").inc()
            self.expectations.expect_deleted(key, victim.uid, now, forced=victim.force)
        if not refused:
            self._refusals.pop(key, None)
        # Events go out after the status write that carries them (events.py): a
        # pass cut short here leaves them pending in the status for the next one.
        posted = self._posted.setdefault(key, set())
        for event in events.due(status, frozenset(posted)):
            if await self._event(obj, event.type, event.reason, event.message, now):
                posted.add(event.id)
            log.info("%s/%s %s: %s", namespace, name, event.reason, event.message)
        posted &= {e.id for e in status.pending_events or ()}
        if result.delete_job:
            await self.kube.delete_job(namespace, name, str(obj["metadata"].get("uid", "")))

    def _refused(
        self, kind: str, manifest: Mapping[str, Any], exc: RefusedError, now: dt.datetime
    ) -> Refusal:
        log.warning("%s: %s", exc, exc.server_message)
        return Refusal(kind, manifest["metadata"]["name"], exc.code, exc.server_message, now)

    async def _event(
        self, obj: Mapping[str, Any], etype: str, reason: str, message: str, now: dt.datetime
    ) -> bool:
        """Post one Event; False when it should be tried again (it stays pending)."""
        try:
            await self.kube.post_event(obj, etype, reason, message, now)
        except AccessDeniedError as exc:
            meta = obj.get("metadata") or {}
            self._rights_refused((meta.get("namespace", ""), meta.get("name", "")), exc)
            return False
        except RetryableError as exc:
            log.warning("could not post event %s (kept for the next pass): %s", reason, exc)
            return False
        except PermanentError as exc:  # the API will never take this one: drop it
            log.warning("could not post event %s: %s", reason, exc)
        return True
