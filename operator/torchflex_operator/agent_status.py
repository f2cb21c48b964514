"""Reading agents' ``AgentReport``: termination messages, and optionally ``GET /status``.

Where it sits: the reconciler asks for reports of one job's pods before
planning. Final reports come from ``containerStatuses[].state.terminated
.message`` (already in the PodView). Live ones are polled over HTTP from
pod IPs that pod status reports (never a Service IP), with a short timeout,
a few pods per job, at most once per interval: status freshness is
best-effort and must never slow reconciling down much. Pods that some
report names lost (``fencing.suspects``) are asked too, in the same pass,
and those that do not answer are remembered (``unanswered``): the planner
fences a pod only on the group's verdict plus its own silence.
"""

from __future__ import annotations

import asyncio
import time

from torchflex_contract import env
from torchflex_contract.progress import STATUS_PATH, AgentReport
from torchflex_operator.fencing import suspects
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
        self._last: dict[object, tuple[float, dict[str, AgentReport], frozenset[str]]] = {}

    def forget(self, key: object) -> None:
        self._last.pop(key, None)

    def unanswered(self, key: object) -> frozenset[str]:
        """Running pods asked in the latest poll of ``key`` whose agent did not answer."""
        last = self._last.get(key)
        return last[2] if last is not None else frozenset()

    async def _ask(self, pods: list[PodView]) -> tuple[dict[str, AgentReport], set[str]]:
        results = await asyncio.gather(
            *(fetch(str(p.pod_ip), self.port, self.timeout) for p in pods)
        )
        got = {p.name: r for p, r in zip(pods, results, strict=True) if r is not None}
        return got, {p.name for p in pods} - set(got)

    async def reports(self, key: object, pods: list[PodView]) -> dict[str, AgentReport]:
        out = {p.name: r for p in pods if (r := final_report(p)) is not None}
        if not self.enabled:
            return out
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last[0] < self.interval:
            live = last[1]
        else:
            runnable = sorted(
                (p for p in pods if p.running and p.pod_ip), key=lambda p: p.index or 0
            )
            targets = runnable[: self.per_job]
            live, silent = await self._ask(targets)
            named = suspects({**live, **out})
            extra = [p for p in runnable if p.name in named and p not in targets]
            if extra:
                more, more_silent = await self._ask(extra[: self.per_job])
                live.update(more)
                silent |= more_silent
            self._last[key] = (now, live, frozenset(silent))
        return {**live, **out}
