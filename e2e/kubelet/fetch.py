"""What the process kubelet reads from the API server.

Where it sits: ``agent.Kubelet`` runs :func:`list_and_watch` on a thread
per kind (pods, Services), feeding its single loop's event queue, and hands
an :class:`ApiFetcher` to
``volumes.prepare`` (config maps, secrets, projected ServiceAccount tokens,
the directory behind a claim via ``provisioner``) and wraps its reads in
:class:`EnvLookup` for ``podspec.container_env``'s ``configMapKeyRef`` /
``secretKeyRef``. Every call goes to the API server; errors are the
caller's to handle (``agent`` retries unreachable ones, reports answers),
except in the watch loop, which lists and watches again until stopped.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from kubernetes import client, watch

from e2e.kubelet import provisioner, volumes


def list_and_watch(
    kind: str,
    lister: Any,
    events: queue.Queue[tuple[str, Any]],
    stop: threading.Event,
    answered: Callable[[], None],
) -> None:
    """List ``kind`` (event ``<kind>-list``), then watch it (``kind``), again
    after any error or the watch's end, until ``stop``; ``answered`` on each
    answer (the kubelet's measure of an API outage)."""
    while not stop.is_set():
        try:
            raw = lister(_preload_content=False)
            data = json.loads(raw.data)
            events.put((f"{kind}-list", data["items"]))
            rv = data["metadata"]["resourceVersion"]
            answered()
            w = watch.Watch()
            for ev in w.stream(lister, resource_version=rv, timeout_seconds=30):
                answered()
                events.put((kind, (ev["type"], ev["raw_object"])))
                if stop.is_set():
                    w.stop()
        except Exception:
            time.sleep(0.5)


class ApiFetcher(volumes.Fetcher):
    def __init__(self, core: client.CoreV1Api) -> None:
        self.core = core

    def config_map(self, ns: str, name: str) -> dict[str, str]:
        cm = self.core.read_namespaced_config_map(name, ns)
        return dict(cm.data or {})

    def secret(self, ns: str, name: str) -> dict[str, str]:
        sec = self.core.read_namespaced_secret(name, ns)
        return volumes.decode_secret({k: str(v) for k, v in (sec.data or {}).items()})

    def token(
        self, ns: str, sa: str, pod: Mapping[str, Any], audience: str | None, seconds: int
    ) -> str:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [audience] if audience else [],
                "expirationSeconds": seconds,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod["metadata"]["name"],
                    "uid": pod["metadata"]["uid"],
                },
            },
        }
        resp = self.core.create_namespaced_service_account_token(sa, ns, body)  # type: ignore[arg-type]
        if resp.status is None:
            raise client.ApiException(status=500, reason="TokenRequest returned no token")
        return str(resp.status.token)

    def claim_path(self, ns: str, claim: str) -> Path:
        return provisioner.claim_path(self.core, ns, claim)


class EnvLookup(Mapping[str, Mapping[str, str]]):
    """Lazily read config maps / secrets referenced from env (missing → empty)."""

    def __init__(self, read: Callable[[str, str], Mapping[str, str]], ns: str) -> None:
        self._read, self._ns = read, ns

    def __getitem__(self, name: str) -> Mapping[str, str]:
        try:
            return dict(self._read(self._ns, name))
        except client.ApiException:
            return {}

    def get(self, name: str, default: Any = None) -> Any:
        return self[name]

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0
