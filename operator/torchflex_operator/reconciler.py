"""One reconcile pass per job: observe, plan, apply; and the workers that run them.

Where it sits: between kopf (``handlers`` feed the caches and the queue) and
the API (``kube``). ``Reconciler.reconcile`` reads the job fresh, overlays
expectations on the cached pods, calls the pure ``planner.plan`` and applies
the result: status first (it carries the failure bookkeeping, guarded by
resourceVersion), then Services, pod creates and deletes, then Events.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from torchflex_contract import labels
from torchflex_operator.agent_status import StatusPoller
from torchflex_operator.cache import JobKey, NodeCache, OwnedCache
from torchflex_operator.errors import InvalidSpecError, PermanentError, RetryableError
from torchflex_operator.expectations import Expectations
from torchflex_operator.kube import Kube
from torchflex_operator.metrics import Metrics
from torchflex_operator.observed import Observed, PodView
from torchflex_operator.planner import Plan, plan
from torchflex_operator.settings import Settings
from torchflex_operator.spec import JobSpec
from torchflex_operator.vocabulary import EventType
from torchflex_operator.workqueue import WorkQueue

log = logging.getLogger(__name__)


def status_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """Merge patch turning ``old`` into ``new`` (removed keys become null)."""
    patch: dict[str, Any] = {k: v for k, v in new.items() if old.get(k) != v}
    for key in old:
        if key not in new:
            patch[key] = None
    return patch


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
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.poller = poller or StatusPoller(enabled=False)
        self.metrics = metrics or Metrics()
        self.cache = OwnedCache()
        self.nodes = NodeCache()
        self.expectations = Expectations()
        self.queue: WorkQueue[JobKey] = WorkQueue()
        self.clock = clock
        self._workers = workers
        self._tasks: list[asyncio.Task[None]] = []
        self._failures: dict[JobKey, int] = {}

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        for n in range(self._workers):
            self._tasks.append(asyncio.create_task(self._worker(), name=f"reconcile-{n}"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    def enqueue(self, key: JobKey, delay: float = 0.0) -> None:
        self.queue.add(key, delay)

    def forget(self, key: JobKey) -> None:
        self.queue.discard(key)
        self.cache.forget(key)
        self.expectations.forget(f"{key[0]}/{key[1]}")
        self.poller.forget(key)
        self.metrics.job_phase(key, None)
        self._failures.pop(key, None)

    async def _worker(self) -> None:
        while True:
            key = await self.queue.get()
            started = time.perf_counter()
            try:
                requeue = await self.reconcile(key)
            except RetryableError as exc:
                n = self._failures.get(key, 0) + 1
                self._failures[key] = n
                delay = exc.retry_after or min(30.0, 0.2 * 2**n)
                log.info("reconcile %s/%s: %s; retrying in %.1fs", *key, exc, delay)
                self.metrics.reconciles.labels("retry").inc()
                self.queue.add(key, delay)
            except PermanentError as exc:
                log.error("reconcile %s/%s: %s", *key, exc)
                self.metrics.reconciles.labels("error").inc()
                self.queue.add(key, self.settings.resync_s * 10)
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

    # -- one pass -------------------------------------------------------------------

    async def observe(self, key: JobKey, now: dt.datetime) -> Observed:
        exp_key = f"{key[0]}/{key[1]}"
        pods = self.expectations.overlay(exp_key, self.cache.job_pods(key), now)
        reports = await self.poller.reports(key, pods)
        return Observed(
            pods=tuple(pods),
            services=self.cache.job_services(key),
            node_ready=dict(self.nodes.ready),
            nodes_known=self.nodes.synced,
            reports=reports,
        )

    async def reconcile(self, key: JobKey) -> float | None:
        namespace, name = key
        obj = await self.kube.get_job(namespace, name)
        if obj is None:
            self.forget(key)
            return None
        now = self.clock()
        try:
            job = JobSpec.parse(obj)
        except InvalidSpecError as exc:
            await self._event(obj, EventType.WARNING, "InvalidSpec", str(exc), now)
            raise
        observed = await self.observe(key, now)
        result = plan(job, obj.get("status") or {}, observed, now, self.settings)
        await self.apply(key, obj, result, now)
        self.metrics.job_phase(key, result.status.get("phase"))
        return result.requeue_after

    async def apply(
        self, key: JobKey, obj: Mapping[str, Any], result: Plan, now: dt.datetime
    ) -> None:
        namespace, name = key
        exp_key = f"{namespace}/{name}"
        old = obj.get("status") or {}
        if result.status and result.status != old:
            rv = str(obj["metadata"].get("resourceVersion", ""))
            await self.kube.patch_job_status(namespace, name, rv, status_patch(old, result.status))
        for svc in result.create_services:
            await self.kube.create_service(svc)
        for manifest in result.create_pods:
            uid = await self.kube.create_pod(manifest)
            view = PodView.from_pod(
                {**manifest, "metadata": {**manifest["metadata"], "uid": uid or ""}}
            )
            self.expectations.expect_created(exp_key, view, now)
            if uid is not None:
                role = manifest["metadata"]["labels"][labels.Label.ROLE]
                self.metrics.pods_created.labels(role).inc()
        for reason in result.replacements:
            self.metrics.pods_replaced.labels(reason.value).inc()
        for victim in result.delete_pods:
            if await self.kube.delete_pod(namespace, victim.name, victim.uid, force=victim.force):
                self.metrics.pods_deleted.labels("force" if victim.force else "graceful").inc()
            self.expectations.expect_deleted(exp_key, victim.uid, now, forced=victim.force)
        for event in result.events:
            await self._event(obj, event.type, event.reason, event.message, now)
            log.info("%s/%s %s: %s", namespace, name, event.reason.value, event.message)
        if result.delete_job:
            await self.kube.delete_job(namespace, name, str(obj["metadata"].get("uid", "")))

    async def _event(
        self, obj: Mapping[str, Any], etype: str, reason: str, message: str, now: dt.datetime
    ) -> None:
        try:
            await self.kube.post_event(obj, etype, reason, message, now)
        except (RetryableError, PermanentError) as exc:  # events are best-effort
            log.warning("could not post event %s: %s", reason, exc)
