"""Reading agents' ``AgentReport``: termination messages, and optionally ``GET /status``.

Where it sits: the reconciler asks for reports of one job's pods before
planning. Final reports come from ``containerStatuses[].state.terminated
.message`` (already in the PodView). Live ones are polled over HTTP from
pod IPs that pod status reports (never a Service IP), with a short timeout,
a few pods per job, at most once per interval: status freshness is
best-effort and must never slow reconciling down much.
"""

from __future__ import annotations

import asyncio
import time

from torchflex_contract import env
from torchflex_contract.progress import STATUS_PATH, AgentReport
from torchflex_operator.observed import PodView

_MAX_BODY = 64 * 1024


def final_report(pod: PodView) -> AgentReport | None:
    if not pod.message.strip().startswith("{"):
        return None
    try:
        return AgentReport.from_json(pod.message)
    except ValueError:
        return None


async def fetch(ip: str, port: int, timeout: float) -> AgentReport | None:
    """One ``GET /status``; None on any error (the agent may not be up yet)."""
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(ip, port)
            try:
                writer.write(f"GET {STATUS_PATH} HTTP/1.0\r\nHost: {ip}\r\n\r\n".encode("ascii"))
                await writer.drain()
                raw = await reader.read(_MAX_BODY)
            finally:
                writer.close()
    except (OSError, TimeoutError):
        return None
    head, _, body = raw.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.") or b" 200 " not in head.split(b"\r\n", 1)[0] + b" ":
        return None
    try:
        return AgentReport.from_json(body.decode("utf-8", "replace"))
    except ValueError:
        return None


class StatusPoller:
    def __init__(
        self,
        enabled: bool,
        *,
        port: int = env.DEFAULT_HEALTH_PORT,
        timeout: float = 0.5,
        per_job: int = 4,
        interval: float = 10.0,
    ) -> None:
        self.enabled = enabled
        self.port = port
        self.timeout = timeout
        self.per_job = per_job
        self.interval = interval
        self._last: dict[object, tuple[float, dict[str, AgentReport]]] = {}

    def forget(self, key: object) -> None:
        self._last.pop(key, None)

    async def reports(self, key: object, pods: list[PodView]) -> dict[str, AgentReport]:
        out = {p.name: r for p in pods if (r := final_report(p)) is not None}
        if not self.enabled:
            return out
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last[0] < self.interval:
            live = last[1]
        else:
            targets = sorted(
                (p for p in pods if p.running and p.pod_ip), key=lambda p: p.index or 0
            )[: self.per_job]
            results = await asyncio.gather(
                *(fetch(str(p.pod_ip), self.port, self.timeout) for p in targets)
            )
            live = {p.name: r for p, r in zip(targets, results, strict=True) if r is not None}
            self._last[key] = (now, live)
        return {**live, **out}
