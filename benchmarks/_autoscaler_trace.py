"""Watches of the cloud's Nodes and one job's pods, each event stamped on arrival.

Where it sits: ``benchmarks.autoscaler`` starts a :class:`Recorder` before it
applies a job and reads the records after the job trains at the larger
size; ``_autoscaler_phases`` (pure) turns them into milestones. Raw watch
streams (the objects as JSON, not the client's models: an Event's null
``eventTime`` or a field newer than the client must not end a watch) on
loopback with the admin kubeconfig. Each stream is bounded by a server-side
timeout and reopened until ``stop``; a reopened stream lists again, and the
earliest arrival of each state is what counts.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from kubernetes import client

from benchmarks._autoscaler_phases import Record
from e2e.autoscaler.groups import GROUP_LABEL
from e2e.cluster import Cluster

STREAM_S = 30


class Recorder:
    """Records every Node of the test cloud and every pod of ``namespace`` as seen."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self._core = client.CoreV1Api(cluster.api_client())
        self._ns = namespace
        self._lock = threading.Lock()
        self._records: dict[tuple[str, str], list[Record]] = {}
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._loop, args=(kind,), daemon=True, name=f"trace-{kind}")
            for kind in ("node", "pod")
        ]

    def __enter__(self) -> Recorder:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=STREAM_S + 5)

    def records(self, kind: str, name: str) -> list[Record]:
        """What was seen of the ``kind`` ("node" or "pod") called ``name``, in arrival order."""
        with self._lock:
            return sorted(self._records.get((kind, name), []), key=lambda r: r[0])

    def _stream(self, kind: str) -> Any:
        common: dict[str, Any] = {
            "watch": True,
            "timeout_seconds": STREAM_S,
            "_preload_content": False,
            "_request_timeout": STREAM_S + 10,
        }
        if kind == "node":
            return self._core.list_node(label_selector=GROUP_LABEL, **common)
        return self._core.list_namespaced_pod(self._ns, **common)

    def _loop(self, kind: str) -> None:
        while not self._stop.is_set():
            try:
                resp = self._stream(kind)
                for line in resp:
                    self._saw(kind, json.loads(line))
                    if self._stop.is_set():
                        break
                resp.release_conn()
            except Exception:  # a dropped stream: open it again
                self._stop.wait(0.2)

    def _saw(self, kind: str, event: dict[str, Any]) -> None:
        obj = event.get("object") or {}
        name = str((obj.get("metadata") or {}).get("name") or "")
        with self._lock:
            self._records.setdefault((kind, name), []).append(
                (time.time(), str(event.get("type")), obj)
            )
