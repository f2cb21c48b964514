"""The thin layer of Kueue admission: each queued job's Workload, cached, created, written.

Where it sits: beside the ``Reconciler``, which owns one ``Workloads``. kopf's
watch on Workloads labelled as ours feeds ``seen`` (and wakes the job); a
pass reads its job's Workload with ``view`` (from that cache; from the API
while Kueue holds the job, when the watch has not delivered it, and once per
``Settings.queue_poll_s`` while it runs: ``workload.must_read``), plans with
``workload.gate``, and after
applying the plan calls ``write``, which does what ``workload.workload_action``
decided: create the Workload, give an evicted job's quota reservation back,
mark it Finished, or delete it (the job's replicas changed, or its queue label
was removed). Decisions stay in ``render.workload``; nothing here decides.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Mapping
from typing import Any

from torchflex_contract import labels
from torchflex_operator.kube import Kube
from torchflex_operator.model.errors import ConflictError, PermanentError
from torchflex_operator.model.kueue import WorkloadView
from torchflex_operator.model.spec import JobSpec
from torchflex_operator.model.vocabulary import KueueLabel, Phase
from torchflex_operator.render import workload
from torchflex_operator.runtime.cache import JobKey

log = logging.getLogger(__name__)


class Workloads:
    def __init__(self, kube: Kube, poll_s: float) -> None:
        self.kube = kube
        self.poll_s = poll_s
        self.objects: dict[JobKey, dict[str, Any]] = {}
        """Latest Workload of each queued job (kopf's watch, our reads and writes)."""
        self.read_at: dict[JobKey, float] = {}
        """When each was last read from the API (``time.monotonic``)."""

    def seen(self, kind: str, obj: Mapping[str, Any]) -> JobKey | None:
        """A Workload from the watch: cache it under its job; the job to wake."""
        meta = obj.get("metadata") or {}
        job = (meta.get("labels") or {}).get(labels.Label.JOB_NAME.value)
        if not job:
            return None
        key = (str(meta.get("namespace", "")), str(job))
        if kind == "DELETED":
            self.objects.pop(key, None)
        else:
            self.objects[key] = dict(obj)
        return key

    def forget(self, key: JobKey) -> None:
        self.objects.pop(key, None)
        self.read_at.pop(key, None)

    async def view(self, key: JobKey, job: JobSpec) -> WorkloadView | None:
        """A queued job's Workload (None: no Workload yet). A job whose queue label
        was removed gets its cached Workload, if any, so that ``write`` deletes it."""
        obj = self.objects.get(key)
        if job.queue_name is None:
            return None if obj is None else WorkloadView.parse(obj)
        cached = None if obj is None else WorkloadView.parse(obj)
        read = self.read_at.get(key)
        age = None if read is None else time.monotonic() - read
        if workload.must_read(job, cached, age, self.poll_s):
            self.read_at[key] = time.monotonic()
            obj = await self.kube.get_workload(key[0], workload.workload_name(job))
            if obj is None:
                self.objects.pop(key, None)
                return None
            self.objects[key] = obj
            cached = WorkloadView.parse(obj)
        return cached

    async def write(
        self,
        key: JobKey,
        job: JobSpec,
        view: WorkloadView | None,
        *,
        phase: Phase | None,
        pods: int,
        now: dt.datetime,
    ) -> None:
        """Create, release or finish the job's Workload (``workload.workload_action``)."""
        action = workload.workload_action(job, view, phase, pods)
        if action is workload.WorkloadAction.CREATE:
            await self._create(key, job)
            return
        if view is None or action is workload.WorkloadAction.NONE:
            return
        if action is workload.WorkloadAction.DELETE:
            await self.kube.delete_workload(key[0], view.name, view.uid)
            self.forget(key)
            log.info("%s/%s: workload %s: deleted", *key, view.name)
            return
        if action is workload.WorkloadAction.RELEASE:
            patch = workload.release_patch(view, now)
        else:
            assert phase is not None  # FINISH is only decided for a finished phase
            patch = workload.finished_patch(view, phase, now)
        try:
            fresh = await self.kube.patch_workload_status(
                key[0], view.name, view.resource_version, patch
            )
        except ConflictError:
            self.objects.pop(key, None)  # Kueue wrote it meanwhile: re-read, re-decide
            raise
        self.objects[key] = fresh
        log.info("%s/%s: workload %s: %s", *key, view.name, action.value)

    async def _create(self, key: JobKey, job: JobSpec) -> None:
        priority = None
        if job.priority_class is not None:
            priority = await self.kube.workload_priority(job.priority_class)
            if priority is None:  # retried at the slow resync, like any permanent error
                raise PermanentError(
                    f"WorkloadPriorityClass {job.priority_class} (label "
                    f"{KueueLabel.PRIORITY_CLASS.value}) does not exist"
                )
        created = await self.kube.create_workload(workload.workload(job, priority))
        if created is not None:
            self.objects[key] = created
