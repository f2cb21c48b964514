"""Reading agents' ``AgentReport``: termination messages, and optionally ``GET /status``.

Where it sits: the reconciler asks for reports of one job's pods before
planning. Final reports come from ``containerStatuses[].state.terminated
.message`` (already in the PodView). Live ones are polled over HTTP from
pod IPs that pod status reports (never a Service IP), with a short timeout,
a few pods per job, at most once per interval: status freshness is
best-effort and must never slow reconciling down much. Pods that some
report names lost (``planning.rules.fencing.suspects``) are asked too, in the same pass,
and those that do not answer are remembered (``unanswered``): the planner
fences a pod only on the group's verdict plus its own silence.

Between polls, one long poll per job (``GET /status?after=<round>``, see
``torchflex_contract.progress``) is held to the agent holding global rank
0 (``leader``): it answers when that agent's rendezvous round changes (a
``kubectl scale``, a lost member) or the agent ends, and then the poller
forgets its cached reports and calls ``on_change`` (the reconciler wakes
the job), so status follows a re-formed group within a round trip instead
of the poll interval, while only one pod per job is asked. Agents hold no
API credentials, so the operator pulls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torchflex_contract import env
from torchflex_contract.progress import (
    ENDING_STATES,
    LONG_POLL_MAX_S,
    STATUS_PATH,
    AgentReport,
    long_poll_path,
)
from torchflex_operator.model.observed import PodView
from torchflex_operator.planning.rules.fencing import suspects

log = logging.getLogger(__name__)

_MAX_BODY = 64 * 1024
_LONG_POLL_MARGIN_S = 5.0


def final_report(pod: PodView) -> AgentReport | None:
    if not pod.message.strip().startswith("{"):
        return None
    try:
        return AgentReport.from_json(pod.message)
    except ValueError:
        return None


def status_request(ip: str, target: str = STATUS_PATH) -> bytes:
    """The HTTP/1.0 request for ``target`` (the agent answers, then closes)."""
    return f"GET {target} HTTP/1.0\r\nHost: {ip}\r\n\r\n".encode("ascii")


def parse_response(raw: bytes) -> AgentReport | None:
    """The report in an HTTP response; None unless it is a 200 with a valid report."""
    head, _, body = raw.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.") or b" 200 " not in head.split(b"\r\n", 1)[0] + b" ":
        return None
    try:
        return AgentReport.from_json(body.decode("utf-8", "replace"))
    except ValueError:
        return None


async def _get(ip: str, port: int, timeout: float, target: str) -> bytes | None:
    """The raw HTTP response to one request; None if none came (refused, timed out)."""
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(ip, port)
            try:
                writer.write(status_request(ip, target))
                await writer.drain()
                # HTTP/1.0: the agent closes after the body, so read to EOF.
                raw = b""
                while len(raw) < _MAX_BODY and (chunk := await reader.read(_MAX_BODY)):
                    raw += chunk
            finally:
                writer.close()
    except (OSError, TimeoutError):
        return None
    return raw


async def fetch(ip: str, port: int, timeout: float) -> AgentReport | None:
    """One ``GET /status``; None on any error (the agent may not be up yet)."""
    raw = await _get(ip, port, timeout, STATUS_PATH)
    return parse_response(raw) if raw is not None else None


async def wait_round(
    ip: str, port: int, after: int, wait: float, timeout: float
) -> tuple[bool, AgentReport | None]:
    """``GET /status?after=..``: the report once its round is not ``after`` (or the
    agent ends), or the unchanged one after ``wait``.

    Returns whether the agent answered at all, and its report (None when the
    answer is not one: an agent from before long polls answers 404).
    """
    raw = await _get(ip, port, wait + timeout, long_poll_path(after, wait))
    return raw is not None, parse_response(raw) if raw is not None else None


def remember_rounds(
    known: Mapping[str, int], pods: Sequence[PodView], reports: Mapping[str, AgentReport]
) -> dict[str, int]:
    """Pod UID -> newest round reported, ``known`` updated with this pass's ``reports``
    (keyed by pod name: each is the current pod's) and pruned to the pods still there."""
    out = {p.uid: known[p.uid] for p in pods if p.uid in known}
    for pod in pods:
        report = reports.get(pod.name)
        if report is not None and report.round >= 0 and pod.uid:
            out[pod.uid] = max(out.get(pod.uid, -1), report.round)
    return out


def leader(pods: Sequence[PodView], reports: Mapping[str, AgentReport]) -> PodView | None:
    """The running pod whose agent holds global rank 0 in the newest round it reports.

    Agents from before ``holds_rank0`` say node rank 0 instead (the same
    thing: node rank 0's workers start at global rank 0).
    """
    best: tuple[int, PodView] | None = None
    for pod in pods:
        report = reports.get(pod.name)
        if report is None or not pod.running or not pod.pod_ip or report.state in ENDING_STATES:
            continue
        if report.round < 0 or not (report.holds_rank0 or report.node_rank == 0):
            continue
        if best is None or report.round > best[0]:
            best = (report.round, pod)
    return best[1] if best is not None else None


def poll_targets(runnable: list[PodView], per_job: int) -> list[PodView]:
    """The pods asked each interval: the first ``per_job``; of a multi-role job, the
    first ``per_job`` of each role (each role has its own rank 0 and rounds)."""
    groups = sorted({p.group for p in runnable if p.group is not None})
    if len(groups) <= 1:
        return runnable[:per_job]
    return [p for g in groups for p in [q for q in runnable if q.group == g][:per_job]]


class StatusPoller:
    def __init__(
        self,
        enabled: bool,
        *,
        port: int = env.DEFAULT_HEALTH_PORT,
        timeout: float = 0.5,
        per_job: int = 4,
        interval: float = 10.0,
        watch_wait: float = LONG_POLL_MAX_S,
        watch_polls: int = 20,
        rearm_s: float = 1.0,
        on_change: Callable[[Any], None] | None = None,
    ) -> None:
        self.enabled = enabled
        self.port = port
        self.timeout = timeout
        self.per_job = per_job
        self.interval = interval
        self.watch_wait = watch_wait
        """Seconds one long poll is held (the agent caps it at ``LONG_POLL_MAX_S``)."""
        self.watch_polls = watch_polls
        """Long polls in a row without a change before the watch ends (a pass re-arms it)."""
        self.rearm_s = rearm_s
        """A job's watch starts at most this often (an agent that answers at once
        or not at all never makes a busy loop)."""
        self.on_change = on_change
        """Called with the job's key when its watched round moved (the reconciler's enqueue)."""
        self._last: dict[object, tuple[float, dict[str, AgentReport], frozenset[str]]] = {}
        self._watches: dict[object, asyncio.Task[None]] = {}
        self._armed_at: dict[object, float] = {}
        self._rounds: dict[object, dict[str, int]] = {}
        """Per job, pod UID -> the newest round that pod was seen reporting."""
        self.wakes = 0
        """How many times a held long poll woke a job (logged; read by tests)."""

    def forget(self, key: object) -> None:
        self._last.pop(key, None)
        self._rounds.pop(key, None)
        self._armed_at.pop(key, None)
        task = self._watches.pop(key, None)
        if task is not None:
            task.cancel()

    async def close(self) -> None:
        """Cancel every held long poll (operator shutdown)."""
        tasks = list(self._watches.values())
        self._watches.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def watching(self, key: object) -> bool:
        task = self._watches.get(key)
        return task is not None and not task.done()

    def _arm(
        self, key: object, pods: Sequence[PodView], reports: Mapping[str, AgentReport]
    ) -> None:
        """Hold a long poll to the job's rank-0 agent unless one is held already."""
        if self.on_change is None or self.watching(key):
            return
        now = time.monotonic()
        if now - self._armed_at.get(key, float("-inf")) < self.rearm_s:
            return
        pod = leader(pods, reports)
        if pod is None or pod.pod_ip is None:
            return
        self._armed_at[key] = now
        after = reports[pod.name].round
        self._watches[key] = asyncio.create_task(
            self._hold(key, pod.pod_ip, after), name=f"status-watch-{pod.name}"
        )

    async def _hold(self, key: object, ip: str, after: int) -> None:
        for _ in range(self.watch_polls):  # bounded; the next pass arms a new one
            started = time.monotonic()
            # A generous margin past the wait: a held request timing out on our
            # side would read as "the agent went away" and wake the job for nothing.
            margin = max(self.timeout, _LONG_POLL_MARGIN_S)
            answered, report = await wait_round(ip, self.port, after, self.watch_wait, margin)
            if answered and report is None:
                return  # an agent without long polls (404): the regular poll serves it
            if report is not None and report.round == after and report.state not in ENDING_STATES:
                if time.monotonic() - started < min(1.0, self.watch_wait / 2):
                    return  # answered at once, unchanged: it does not hold requests
                continue  # held for the whole wait: nothing moved
            # The round moved, the agent is ending, or it stopped answering
            # (its pod went away): whatever it is, look again now.
            self.wakes += 1
            log.debug("status watch %s: round %s -> %s", key, after, report and report.round)
            last = self._last.get(key)
            if last is not None:
                self._last[key] = (float("-inf"), last[1], last[2])
            if self.on_change is not None:
                self.on_change(key)
            return

    def rounds_seen(
        self, key: object, pods: Sequence[PodView], reports: Mapping[str, AgentReport]
    ) -> dict[str, int]:
        """Per pod name, the newest round its current pod (by UID) ever reported.

        Remembered across passes, so a pod that reported round 4 and then fell
        silent is still known to have joined after a loss in round 3. Pods that
        are gone are forgotten.
        """
        known = remember_rounds(self._rounds.get(key, {}), pods, reports)
        self._rounds[key] = known
        return {p.name: known[p.uid] for p in pods if p.uid in known}

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
            targets = poll_targets(runnable, self.per_job)
            live, silent = await self._ask(targets)
            named = suspects({**live, **out})
            extra = [p for p in runnable if p.name in named and p not in targets]
            if extra:
                more, more_silent = await self._ask(extra[: self.per_job])
                live.update(more)
                silent |= more_silent
            self._last[key] = (now, live, frozenset(silent))
        merged = {**live, **out}
        self._arm(key, pods, merged)
        return merged
