"""Exit codes of ``torchflex-agent``: the contract the operator reads back.

Where it sits: the agent exits with one of these; the operator classifies a
terminated worker pod by it (see ``torchflex_operator.planning.rules.failures``). Codes 128+N
are what the kernel reports for a process killed by signal N; they are not
chosen by the agent but the operator must understand them too.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """What an agent's exit means for the job."""

    SUCCESS = 0
    """The worker group finished; the job may complete."""

    USER_ERROR = 1
    """Workers failed more than ``maxRestarts`` times: permanent, counted."""

    USAGE = 2
    """Bad flags or configuration: permanent, counted, never retried blindly."""

    INFRA_ERROR = 69
    """Rendezvous backend unreachable or similar: retryable, counted."""

    PREEMPTED = 75
    """SIGTERM received, workers checkpointed, left the rendezvous: retryable, not counted."""

    RENDEZVOUS_CLOSED = 76
    """The job's rendezvous was closed (job finishing): not a failure."""

    BAD_NODE = 79
    """The opt-in node check failed before the agent joined (a device computing wrong
    results or far slower than its peers'): replaced elsewhere, not counted."""

    BAD_COMMAND = 127
    """The training command cannot be started: a user error, permanent, counted.

    Its executable is not found or not executable (the agent's spawn fails with
    ENOENT / EACCES / ENOEXEC), or it is ``python [opts] script.py`` and the
    script cannot be opened. Nothing runs, so nothing is retried: the agent
    closes the job's rendezvous as failed (other agents stop, replacements do
    not wait) and names the command in its termination message. 127 is a
    shell's "command not found"; it is below 128, so never a signal's code."""


SIGNAL_BASE = 128
SIGKILL_EXIT = SIGNAL_BASE + 9
SIGTERM_EXIT = SIGNAL_BASE + 15


class Disposition(enum.Enum):
    """How the operator treats a pod that ended with a given code."""

    SUCCEEDED = "Succeeded"
    PERMANENT = "Permanent"  # counted against backoffLimit
    RETRYABLE_COUNTED = "RetryableCounted"  # replaced, counted
    RETRYABLE_FREE = "RetryableFree"  # replaced, not counted


def disposition(code: int) -> Disposition:
    """Classify an exit code alone (the operator also weighs pod conditions)."""
    if code == ExitCode.SUCCESS:
        return Disposition.SUCCEEDED
    if code in (ExitCode.PREEMPTED, ExitCode.RENDEZVOUS_CLOSED, ExitCode.BAD_NODE, SIGTERM_EXIT):
        return Disposition.RETRYABLE_FREE
    if code == ExitCode.INFRA_ERROR:
        return Disposition.RETRYABLE_COUNTED
    if code > SIGNAL_BASE:
        # The agent itself was killed (SIGKILL, SIGABRT, SIGSEGV, ...): the
        # agent never exits with these on its own, so it is the platform or a
        # crash, not the user's code (that surfaces as USER_ERROR). Counted,
        # so a crash loop still ends at backoffLimit.
        return Disposition.RETRYABLE_COUNTED
    return Disposition.PERMANENT
