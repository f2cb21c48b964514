"""The worker group's vocabulary, pure: ``GroupState``, what a poll observes.

Where it sits: ``workers.group.WorkerGroup.poll`` reports in it and the loop's
pure policy (``loop.logic.policy``) decides on it; defined here, below both,
so the policy imports nothing that spawns or signals a process (the purity
contract over every ``logic`` module in ``pyproject.toml`` keeps it so).
"""

from __future__ import annotations

import enum


class GroupState(enum.Enum):
    """A round's worker group as ``workers.group.WorkerGroup.poll`` observes it."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
