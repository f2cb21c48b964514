"""The reconcile workers: take a job off the queue while leading, run its pass, and
the error policy that decides when the job is tried again.

Where it sits: started by the ``Reconciler`` (``runtime.reconcile``), which hands it
the pass to run and the warning to give when RBAC refuses. A retryable error is
retried with a growing delay (or the one the API asked for), a refusal of rights and
a permanent error at the slow resync, a bug at 30 s; a pass that worked is requeued
when its plan asked. Workers wait on the ``leader`` gate: a standby takes no key.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from torchflex_operator.model.errors import AccessDeniedError, PermanentError, RetryableError
from torchflex_operator.runtime.cache import JobKey
from torchflex_operator.runtime.leader import Gate
from torchflex_operator.runtime.logsetup import CURRENT_JOB
from torchflex_operator.runtime.memory import JobMemory
from torchflex_operator.runtime.metrics import Metrics
from torchflex_operator.runtime.workqueue import WorkQueue

log = logging.getLogger(__name__)


class Worker:
    def __init__(
        self,
        *,
        queue: WorkQueue[JobKey],
        gate: Gate,
        metrics: Metrics,
        memory: JobMemory,
        reconcile: Callable[[JobKey], Awaitable[float | None]],
        rights_refused: Callable[[JobKey, AccessDeniedError], None],
        resync_s: float,
    ) -> None:
        self.queue = queue
        self.gate = gate
        self.metrics = metrics
        self.memory = memory
        self.reconcile = reconcile
        self.rights_refused = rights_refused
        self.resync_s = resync_s

    async def run(self) -> None:
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
                await self.one(key)
            finally:
                self.metrics.latency.observe(time.perf_counter() - started)
                self.queue.done(key)
                CURRENT_JOB.set(None)

    async def one(self, key: JobKey) -> None:
        """Run one pass of ``key`` and requeue it as its outcome says."""
        try:
            requeue = await self.reconcile(key)
        except RetryableError as exc:
            record = self.memory.record(key)
            record.failures += 1
            delay = exc.retry_after or min(30.0, 0.2 * 2**record.failures)
            log.info("reconcile %s/%s: %s; retrying in %.1fs", *key, exc, delay)
            self.metrics.reconciles.labels("retry").inc()
            self.queue.add(key, delay)
        except AccessDeniedError as exc:
            self.rights_refused(key, exc)
            self.metrics.reconciles.labels("denied").inc()
            self.queue.add(key, self.resync_s)
        except PermanentError as exc:
            log.error("reconcile %s/%s: %s", *key, exc)
            self.metrics.reconciles.labels("error").inc()
            self.queue.add(key, self.resync_s)
        except Exception:  # a bug: keep the operator alive, retry slowly
            log.exception("reconcile %s/%s crashed", *key)
            self.metrics.reconciles.labels("crash").inc()
            self.queue.add(key, 30.0)
        else:
            kept = self.memory.peek(key)
            if kept is not None:
                kept.failures = 0
            self.metrics.reconciles.labels("ok").inc()
            if requeue is not None:
                self.queue.add(key, requeue)
