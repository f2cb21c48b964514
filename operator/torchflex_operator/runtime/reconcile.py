"""One reconcile pass per job: observe, plan, apply; and the workers that run them.

Where it sits: between kopf (``handlers`` feed the caches and the queue) and
the API (``kube``). ``Reconciler.reconcile`` takes the job and its pods from
the watch-fed caches, overlays expectations, parses the job's spec and
status (``JobSpec``, ``JobStatus``), calls the pure ``planning.plan`` and
hands the result to ``runtime.apply`` (status first, then the children, then
Events). A pass that changes nothing makes no API request, so the slow resync
(``--resync``) of an idle job is free. The first pass of a job after start
or takeover reads the job and its pods from the API once (the watches may
not have delivered them yet, and a standby's cache is stale); so does
the pass after a status write was refused as stale (409). The workers
(``runtime.worker``) wait on the ``leader`` gate: a standby replica takes no
key and writes nothing. What the process remembers per job between passes is
one ``JobMemory`` (``runtime.memory``), forgotten by one call.
Gang scheduling (``render.podgroup``): the first pass of the process asks API
discovery whether PodGroups are served and keeps the answer in ``settings``;
where they are, a live job's PodGroup is written before anything else of the
pass, once per process and again when ``minReplicas`` changes. The job's
PodDisruptionBudget (``render.pdb``) is written the same way, and deleted
once when the job has finished; what to write is ``planning.scheduling``'s.
Kueue (``render.workload``, ``admission``): a job labelled with a queue name is
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
    RetryableError,
)
from torchflex_operator.model.observed import Observed
from torchflex_operator.model.settings import Settings
from torchflex_operator.model.spec import JobSpec
from torchflex_operator.model.status import JobStatus
from torchflex_operator.model.vocabulary import EventReason, EventType, GangScheduling
from torchflex_operator.planning import plan, scheduling
from torchflex_operator.planning.rules.defaulting import replicas_patch
from torchflex_operator.render import podgroup, workload
from torchflex_operator.runtime.admission import Workloads
from torchflex_operator.runtime.agent_status import StatusPoller
from torchflex_operator.runtime.apply import Applier
from torchflex_operator.runtime.cache import JobKey, NodeCache, OwnedCache
from torchflex_operator.runtime.expectations import TIMEOUT as EXPECTATION_TIMEOUT
from torchflex_operator.runtime.expectations import Expectations
from torchflex_operator.runtime.leader import Gate
from torchflex_operator.runtime.memory import JobMemory
from torchflex_operator.runtime.metrics import Metrics
from torchflex_operator.runtime.worker import Worker
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
        self.memory = JobMemory()
        """What this process remembers about each job between passes (one ``forget``)."""
        self.applier = Applier(
            kube, self.memory, self.expectations, self.metrics, self._rights_refused
        )
        self._workers = workers
        self._tasks: list[asyncio.Task[None]] = []
        self._denied_warned_at: float | None = None
        self.workloads = Workloads(kube, settings.queue_poll_s)
        self._gang_asked = asyncio.Lock()
        """Held while discovery is asked: the workers' first passes ask once between them."""
        self.metrics.instrument(self.queue, lambda: self.jobs if self.gate.active else {})

    @property
    def jobs(self) -> dict[JobKey, dict[str, Any]]:
        """Latest ElasticJob objects from the watch (or our own status writes)."""
        return self.memory.objects

    @property
    def _synced(self) -> set[JobKey]:
        return self.memory.synced

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        self.metrics.active.set(1 if self.gate.active else 0)
        self.gate.start()
        worker = Worker(
            queue=self.queue,
            gate=self.gate,
            metrics=self.metrics,
            memory=self.memory,
            reconcile=self.reconcile,
            rights_refused=self._rights_refused,
            resync_s=self.settings.resync_s,
        )
        for n in range(self._workers):
            self._tasks.append(asyncio.create_task(worker.run(), name=f"reconcile-{n}"))

    async def stop(self) -> None:
        await self.gate.stop()
        await cancel_all(self._tasks)
        await self.poller.close()

    def enqueue(self, key: JobKey, delay: float = 0.0) -> None:
        self.queue.add(key, delay)

    def job_seen(self, key: JobKey, obj: Mapping[str, Any]) -> None:
        """A job from the watch: cache it and wake its reconcile."""
        self.memory.objects[key] = dict(obj)
        self.enqueue(key)

    def forget(self, key: JobKey) -> None:
        self.memory.forget(key)
        self.queue.discard(key)
        self.cache.forget(key)
        self.expectations.forget(key)
        self.poller.forget(key)
        self.metrics.job_phase(key, None)
        self.workloads.forget(key)

    def _gate_changed(self, active: bool) -> None:
        self.metrics.active.set(1 if active else 0)
        if active:
            # Taking over: what we cached as a standby may be stale (kopf's watches
            # were paused). Each job's first pass re-reads it and its pods.
            self.memory.synced.clear()
            for key in list(self.memory.objects):
                self.enqueue(key)

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
        record = self.memory.record(key)
        # A refusal is re-recorded on every refused retry (each refusal_retry_s);
        # one not renewed for three of those is about an object no longer wanted.
        stale = now - dt.timedelta(seconds=3 * self.settings.refusal_retry_s)
        refused = record.refusals
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
            refusals=dict(refused),
            posted_events=frozenset(record.posted),
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
        self.memory.objects[key] = obj
        self.memory.synced.add(key)
        return obj

    async def _job(self, key: JobKey) -> dict[str, Any] | None:
        """The job's object, read from the API when needed, defaulted where it must be."""
        synced = key in self.memory.synced
        obj = self.memory.objects.get(key) if synced else await self._sync(key)
        if obj is None or (defaults := replicas_patch(obj)) is None:
            return obj
        # Absent spec.replicas breaks the scale subresource (defaulting.py).
        rv = str(obj["metadata"].get("resourceVersion", ""))
        try:
            obj = await self.kube.patch_job(*key, rv, defaults)
        except ConflictError:
            self.memory.synced.discard(key)
            raise
        self.memory.objects[key] = obj
        return obj

    async def reconcile(self, key: JobKey) -> float | None:
        obj = await self._job(key)
        if obj is None:
            self.forget(key)
            return None
        now = self.clock()
        try:
            job = JobSpec.parse(obj)
        except InvalidSpecError as exc:
            await self.applier.event(
                obj, EventType.WARNING, EventReason.INVALID_SPEC, str(exc), now
            )
            raise
        observed = await self.observe(key, now)
        view = await self.workloads.view(key, job)
        observed = dataclasses.replace(observed, queue=workload.gate(job, view))
        mode = await self._gang_mode()
        result = plan(job, JobStatus.parse(obj.get("status") or {}), observed, now, self.settings)
        if result.status is not None:  # None: the job is being deleted
            status = dataclasses.replace(result.status, gang_scheduling=mode)
            result = dataclasses.replace(result, status=status)
            finished = status.phase is not None and status.phase.finished
            await self._apply_scheduling(
                key, obj=obj, job=job, mode=mode, finished=finished, now=now
            )
        await self.applier.apply(key, obj, result, now)
        phase = None if result.status is None else result.status.phase
        await self.workloads.write(key, job, view, phase=phase, pods=len(observed.pods), now=now)
        self.metrics.job_phase(key, phase)
        return self._requeue(key, result.requeue_after, observed, now)

    def _requeue(
        self, key: JobKey, requeue: float | None, observed: Observed, now: dt.datetime
    ) -> float | None:
        """When to look at the job again: what the plan asked, or sooner."""
        if self.poller.enabled and requeue is not None and any(p.running for p in observed.pods):
            # Agents' progress (world size, round) is only seen by asking again.
            requeue = min(requeue, self.poller.interval)
        if any(r.at == now for r in self.memory.record(key).refusals.values()):
            # A create was refused in this pass: say so in status at once.
            requeue = 1.0 if requeue is None else min(requeue, 1.0)
        if self.expectations.pending(key):
            # An expectation the watch never meets ends by timeout; make sure a
            # pass runs then, even if no event comes (no silent resync wait).
            wake = EXPECTATION_TIMEOUT.total_seconds() + 1.0
            requeue = wake if requeue is None else min(requeue, wake)
        return requeue

    async def _gang_mode(self) -> GangScheduling:
        """Whether the API serves PodGroups, asked once per process (``render.podgroup``)."""
        async with self._gang_asked:
            mode = self.settings.gang_scheduling
            if mode is None:
                mode = podgroup.mode(await self.kube.pod_groups_served())
                log.info("gang scheduling of each job's minimum: %s", mode.value)
                self.settings = dataclasses.replace(self.settings, gang_scheduling=mode)
            return mode

    async def _apply_scheduling(
        self,
        key: JobKey,
        *,
        obj: Mapping[str, Any],
        job: JobSpec,
        mode: GangScheduling,
        finished: bool,
        now: dt.datetime,
    ) -> None:
        """The PodGroup first (a pod naming a group that is not there waits), then the
        budget, as ``planning.scheduling`` decides from what this process wrote; one of
        each per worker group (each role of a multi-role job has its own)."""
        written = self.memory.record(key).written
        for group in job.role_views():
            seen = written.get(group.role, scheduling.Written())
            writes = scheduling.decide(group, mode, finished, seen)
            if writes.pod_group is not None:
                try:
                    await self.applier.pod_group(key, group, writes.pod_group)
                except ApiAbsentError as exc:
                    # Served at discovery, 404 now: the API was turned off, or the namespace
                    # is going. Ask discovery again on the next pass, planned from its answer.
                    self.settings = dataclasses.replace(self.settings, gang_scheduling=None)
                    raise RetryableError(str(exc)) from exc
            await self.applier.budget(key, obj, group, writes, now)
