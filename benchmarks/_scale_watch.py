"""Watches of one namespace's pods and ElasticJobs, timestamped on arrival.

Where it sits: ``benchmarks.operator_scale`` starts a ``Tracker`` on the
benchmark namespace (with the admin kubeconfig, straight to the API server,
not through the operator's counting proxy) and reads from it when pods
appeared, ran, vanished and when jobs reached a phase. Raw watch streams
are parsed into the few fields needed, so tracking 3,200 pods stays cheap
on a 2-core machine. Every stream is bounded by a server-side timeout and
reopened from the last resource version until ``stop()``.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from torchflex_contract import labels


@dataclasses.dataclass
class PodSeen:
    name: str
    job: str
    role: str
    added: float
    running: float | None = None
    terminating: bool = False
    gone: float | None = None


class Tracker:
    def __init__(self, api_client: Any, namespace: str) -> None:
        from kubernetes import client

        self._core = client.CoreV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self.namespace = namespace
        self.pods: dict[str, PodSeen] = {}  # by uid
        self.job_phase: dict[str, str] = {}
        self.job_running_at: dict[str, float] = {}
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._loop, args=(self._pods_call, self._on_pod), daemon=True),
            threading.Thread(target=self._loop, args=(self._jobs_call, self._on_job), daemon=True),
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(70)

    # -- streams ---------------------------------------------------------

    def _pods_call(self, rv: str) -> Any:
        return self._core.list_namespaced_pod(
            self.namespace, watch=True, resource_version=rv, timeout_seconds=20,
            allow_watch_bookmarks=True, _preload_content=False,
        )  # fmt: skip

    def _jobs_call(self, rv: str) -> Any:
        return self._custom.list_namespaced_custom_object(
            labels.GROUP, labels.VERSION, self.namespace, labels.PLURAL,
            watch=True, resource_version=rv, timeout_seconds=20,
            allow_watch_bookmarks=True, _preload_content=False,
        )  # fmt: skip

    def _loop(
        self, call: Callable[[str], Any], handle: Callable[[str, dict[str, Any]], None]
    ) -> None:
        rv = "0"
        while not self._stop.is_set():
            try:
                resp = call(rv)
                try:
                    for line in resp:
                        if self._stop.is_set():
                            break
                        event = json.loads(line)
                        obj = event.get("object", {})
                        if event.get("type") == "ERROR":
                            rv = "0"  # expired: restart from "any" (a relist)
                            break
                        rv = obj.get("metadata", {}).get("resourceVersion", rv)
                        if event.get("type") != "BOOKMARK":
                            handle(event["type"], obj)
                finally:
                    resp.release_conn()
            except Exception as exc:
                self.errors.append(repr(exc)[:200])
                self._stop.wait(1.0)

    def _on_pod(self, kind: str, obj: dict[str, Any]) -> None:
        now = time.monotonic()
        meta = obj.get("metadata", {})
        uid = meta.get("uid", "")
        lab = meta.get("labels") or {}
        with self._lock:
            seen = self.pods.get(uid)
            if seen is None:
                seen = PodSeen(
                    meta.get("name", ""),
                    lab.get(labels.Label.JOB_NAME, ""),
                    lab.get(labels.Label.ROLE, ""),
                    now,
                )
                self.pods[uid] = seen
            if kind == "DELETED":
                seen.gone = now
            if meta.get("deletionTimestamp"):
                seen.terminating = True
            if seen.running is None and obj.get("status", {}).get("phase") == "Running":
                seen.running = now

    def _on_job(self, kind: str, obj: dict[str, Any]) -> None:
        now = time.monotonic()
        name = obj.get("metadata", {}).get("name", "")
        phase = (obj.get("status") or {}).get("phase", "")
        with self._lock:
            if kind == "DELETED":
                self.job_phase.pop(name, None)
                return
            self.job_phase[name] = phase
            if phase == "Running" and name not in self.job_running_at:
                self.job_running_at[name] = now

    # -- queries ----------------------------------------------------------

    def workers(self) -> list[PodSeen]:
        """Worker pods that exist and are not being deleted."""
        with self._lock:
            return [
                p
                for p in self.pods.values()
                if p.role == labels.PodKind.WORKER and p.gone is None and not p.terminating
            ]

    def snapshot(self) -> dict[str, PodSeen]:
        with self._lock:
            return {uid: dataclasses.replace(p) for uid, p in self.pods.items()}

    def phases(self) -> dict[str, str]:
        with self._lock:
            return dict(self.job_phase)
