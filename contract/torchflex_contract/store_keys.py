"""The key layout every rendezvous backend shares.

Where it sits: the agent's rendezvous code builds every key through
``Keys``; tests and the store pod use it to inspect state. All keys of a job
live under one prefix derived from its rendezvous id, so two jobs never
collide on a shared store or etcd.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Final

ROOT: Final = "/torchflex/v1"
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def sanitize_run_id(run_id: str) -> str:
    """A run id usable as a key segment; rejects empty and the torchrun default."""
    if not run_id or run_id == "none":
        raise ValueError("rendezvous id must be set and not 'none' (jobs would share state)")
    return _SAFE.sub("_", run_id)


@dataclasses.dataclass(frozen=True)
class Keys:
    run_id: str

    @property
    def prefix(self) -> str:
        return f"{ROOT}/{sanitize_run_id(self.run_id)}"

    def key(self, *parts: object) -> str:
        return "/".join([self.prefix, *(str(p) for p in parts)])


# Key names under ``Keys(run_id).prefix``. Job-wide keys:
CURRENT_ROUND: Final = "rdzv/current"
"""Decimal round number: a hint where to start; per-round keys are the truth."""
JOB_CLOSED: Final = "rdzv/job-closed"
"""JSON ``{"outcome": "succeeded"|"failed", "message": ...}``: no new rounds."""
RESTARTS: Final = "restarts"
"""Decimal counter of worker-failure restarts of the whole job (not per agent)."""
NODE_CHECKS: Final = "node-check"
"""``node-check/count``: ticket counter; ``node-check/<i>``: JSON ``{"node", "gflops", "gbps"}``
of the i-th agent that passed its node check (``gbps``: its all_reduce with a peer, null if
none), which later agents compare themselves with; ``node-check/lobby``: JSON offer
``{"node", "name", "addr", "port", "until"}`` of a node waiting for a peer to run its
collective with, replaced (compare-and-set) by the claim ``{"claim", "by", "name"}`` that
pairs it or by ``{"withdrawn"}`` when its wait ends; ``node-check/started`` and
``node-check/ended``: ticket counters of the agents that began and ended their check (a
node in the lobby waits longer while others are still checking)."""
INCARNATION: Final = "incarnation"
"""Random id written once per store lifetime (``compare_set`` from absent): a restarted
c10d store starts round numbering again at 0 under a new id, so checkpoints only
compare round numbers of the same incarnation."""

# Per-round keys live under ``rdzv/round/<r>/``:
ROUND: Final = "rdzv/round"
ARRIVALS: Final = "arrivals"
"""Ticket counter (``KVStore.take_ticket``): a joiner's arrival index, its rank if admitted."""
NODE: Final = "node"
"""``node/<index>``: JSON descriptor (id, addr, master port, nproc) of a joiner."""
CLOSED: Final = "closed"
"""JSON membership written once by the closer (``compare_set`` from absent)."""
STALE: Final = "stale"
"""JSON ``{"reason", "by", "detail"}``: the round is over, everyone re-forms."""
WAITING: Final = "waiting"
"""Ticket counter of agents that arrived after closure and wait for the next round."""
HEARTBEAT: Final = "hb"
"""``hb/<node_rank>``: liveness counter a member increments while running."""
FINISHED: Final = "finished"
"""``finished/<node_rank>``: the member's workers succeeded; not a lost member."""
LOST: Final = "lost"
"""JSON list of ``{"rank", "how"}`` (how: ``silent`` or ``exited``): members this round
declared lost, written by their detectors before they mark the round stale."""
FAILURE_COUNTED: Final = "failure-counted"
"""Set by the one agent that counted this round's worker failure as a restart."""
FAILURE: Final = "failure"
"""``failure/<node_rank>``: the worker failure a member saw in this round (text),
so the agent that gives up can name the root cause, not a peer-loss symptom."""

ACTIVITY: Final = "activity"
"""Counter a member adds to (at most once per publish interval) while its workers make
training progress or declare a pause; a member sees the job hung when it stops moving
for the hang timeout on its own clock (``loop.logic.stall``)."""
SPEED: Final = "speed"
"""``speed/<node_rank>``: JSON ``{"forward_s", "seq"}``, that member's mean forward time
over its latest window (``loop.logic.straggler``), read by node rank 0."""
STALL: Final = "stall"
"""``stall/<node_rank>``: JSON list of that member's ``RankStall`` entries, written once
the round was marked stale as a hang; node rank 0 assembles the ``StallReport``."""


def round_key(keys: Keys, round_no: int, *parts: object) -> str:
    """A per-round key, e.g. ``round_key(keys, 3, STALE)``."""
    return keys.key(ROUND, round_no, *parts)
