"""Watching a running round for a hang, and recording every rank when one is declared.

Where it sits: ``loop.supervise.RoundSupervisor`` makes one ``StallWatch`` per
round and calls ``check`` on each wake-up while the workers run; it returns
the timeout in force once the job is hung (``loop.logic.stall``). Then every
member calls ``record`` (its ranks' pulses and stacks into the store), and
the member holding node rank 0 calls ``assemble_later`` (every member's
entries, the culprit first, on a thread of its own) for its report. The
workers' side is ``pulse``: hooks the fork server's bootstrap installs, so
unchanged scripts are watched.

Every ``straggler.WINDOW_S`` it also publishes its node's mean forward time, and
the member holding node rank 0 compares the nodes (``stragglers``).

Store cost: a member adds to the round's activity counter at most once per
check while its workers progress (or hold a declared pause), else reads it
once: one operation per ``stall.check_every`` seconds (a tenth of the
timeout, 0.5-5 s).
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import threading
import time
from collections.abc import Callable

from torchflex_agent.errors import StoreUnavailableError
from torchflex_agent.loop.logic import stall, straggler
from torchflex_agent.pulse import Pulse
from torchflex_agent.rendezvous.logic import RendezvousResult
from torchflex_agent.rendezvous.protocol import Rendezvous
from torchflex_agent.workers.group import WorkerGroup
from torchflex_contract.progress import RankStall, StallReport, StragglerReport

log = logging.getLogger(__name__)

GATHER_S = 5.0
"""How long node rank 0 waits for the other members' entries of a declared hang."""
_GATHER_POLL_S = 0.2


@dataclasses.dataclass
class StallWatch:
    """One round's hang detector on this member (``check`` from the supervisor's loop)."""

    rdzv: Rendezvous
    result: RendezvousResult
    explicit: float | None
    """``--hang-timeout``: None derives it from step times, 0 turns detection off."""
    clock: Callable[[], float] = time.monotonic
    _state: stall.StallClock | None = None
    _next: float = 0.0
    _published: float = 0.0
    _step_s: float | None = None
    _speed_next: float = 0.0
    _speed_seq: int = 0
    _forward: dict[int, tuple[float, int]] = dataclasses.field(default_factory=dict)
    _seen: dict[int, int] = dataclasses.field(default_factory=dict)
    _tracker: straggler.StragglerTracker = dataclasses.field(
        default_factory=straggler.StragglerTracker
    )
    stragglers: tuple[StragglerReport, ...] = ()
    """Node rank 0 only: the nodes slow for ``straggler.WINDOWS`` windows, latest window."""

    @property
    def limit(self) -> float | None:
        return stall.timeout(self.explicit, self._step_s)

    def check(self, group: WorkerGroup) -> float | None:
        """The timeout in force if the job is hung now, else None (rate-limited)."""
        now = self.clock()
        if self._state is None:
            self._state = stall.StallClock.start(now)
            self._next = now
        if now < self._next:
            return None
        self._next = now + stall.check_every(self.limit)
        every = group.pulses()
        if now >= self._speed_next:
            self._speed_next = now + straggler.WINDOW_S
            self._compare_speeds(every)
        pulses = [p for p in every if p is not None]
        if not pulses or (self.explicit is not None and self.explicit <= 0):
            return None  # workers nobody can watch (no pulse), or detection off
        self._learn_step_time(pulses)
        latest = max((p.last_activity for p in pulses), default=0.0)
        paused = any(p.paused(now) for p in pulses)
        if latest > self._published or paused:
            self._published = max(latest, now if paused else 0.0)
            counter: int | None = self.rdzv.add_activity(self.result.round)
        else:
            counter = self.rdzv.activity(self.result.round)
        self._state = self._state.observe(now, counter, self.limit)
        return self.limit if self._state.stalled(now, self.limit) else None

    def _learn_step_time(self, pulses: list[Pulse]) -> None:
        """The slowest local worker's mean step time, read off its pulse (no sampling:
        a job that stalls within one check of its start still has one)."""
        got = [stall.step_seconds(p.first_step, p.last_step, p.steps) for p in pulses]
        known = [s for s in got if s is not None]
        if known:
            self._step_s = max(known)

    def _compare_speeds(self, pulses: list[Pulse | None]) -> None:
        """Publish this node's mean forward time over the window; node rank 0 compares."""
        means = []
        for local_rank, pulse in enumerate(pulses):
            if pulse is None:
                continue
            now = (pulse.forward_total, pulse.forwards)
            before = self._forward.get(local_rank)
            self._forward[local_rank] = now
            got = None if before is None else straggler.window_mean(before, now)
            if got is not None:
                means.append(got)
        if means:
            self._speed_seq += 1
            forward = statistics.median(means)
            self.rdzv.put_speed(self.result.round, self.result.node_rank, forward, self._speed_seq)
        if self.result.node_rank != 0:
            return
        fresh = {}
        published = self.rdzv.speeds(self.result.round, self.result.num_nodes)
        for node, (seconds, seq) in published.items():
            if seq > self._seen.get(node, 0):
                self._seen[node] = seq
                fresh[node] = seconds
        if len(fresh) < 2:
            return
        self._tracker, flagged = self._tracker.observe(fresh)
        self.stragglers = tuple(
            StragglerReport(
                node_rank=f.node_rank,
                pod=self.result.nodes[f.node_rank].pod,
                forward_s=round(f.forward_s, 4),
                ratio=f.ratio,
                round=self.result.round,
            )
            for f in flagged
        )


def record(
    rdzv: Rendezvous, result: RendezvousResult, group: WorkerGroup, clock: Callable[[], float]
) -> list[RankStall]:
    """This member's ranks now: pulses and stacks (logged whole), written to the store."""
    now = clock()
    pulses = group.pulses()
    stacks = dict(group.stacks(native=False))
    pod = result.nodes[result.node_rank].pod if 0 <= result.node_rank < result.num_nodes else ""
    entries = []
    for local_rank, pulse in enumerate(pulses):
        rank = result.rank_offset + local_rank
        dump = stacks.get(local_rank, "")
        log.warning(
            "round %d: hang: rank %d's stacks:\n%s", result.round, rank, dump or "(none read)"
        )
        main = stall.main_thread(dump)
        last = pulse.last_activity if pulse is not None and pulse.last_activity else None
        entries.append(
            RankStall(
                rank=rank,
                pod=pod,
                steps=pulse.steps if pulse is not None else 0,
                idle=round(now - last, 1) if last is not None else -1.0,
                waiting=stall.waiting_on_peers(main),
                stack=stall.bounded_stack(main),
            )
        )
    rdzv.put_stall(result.round, result.node_rank, entries)
    return entries


def assemble_later(
    rdzv: Rendezvous, result: RendezvousResult, limit: float, done: Callable[[StallReport], None]
) -> threading.Thread:
    """``assemble`` on a daemon thread with a store connection of its own, then ``done``:
    node rank 0 re-joins at once instead of waiting for the others' entries."""

    def run() -> None:
        own = rdzv.clone()
        try:
            done(assemble(own, result, limit))
        except StoreUnavailableError as exc:
            log.warning("round %d: hang report not assembled: %s", result.round, exc)
        finally:
            own.close()

    thread = threading.Thread(target=run, daemon=True, name="stall-report")
    thread.start()
    return thread


def assemble(rdzv: Rendezvous, result: RendezvousResult, limit: float) -> StallReport:
    """Node rank 0: every member's entries (waiting up to ``GATHER_S``), the culprit first."""
    deadline = time.monotonic() + GATHER_S
    got = rdzv.stalls(result.round, result.num_nodes)
    while len(got) < result.num_nodes and time.monotonic() < deadline:
        time.sleep(_GATHER_POLL_S)
        got = rdzv.stalls(result.round, result.num_nodes)
    entries = [e for node in sorted(got) for e in got[node]]
    first = stall.culprit(entries)
    missing = sorted(set(range(result.num_nodes)) - set(got))
    if missing:
        log.warning("round %d: hang: no entry from node rank(s) %s", result.round, missing)
    return StallReport(
        round=result.round,
        rank=first.rank if first is not None else -1,
        pod=first.pod if first is not None else "",
        timeout=limit,
        ranks=stall.ordered(entries, first),
    )
