"""Typed errors of the agent: what went wrong, and whether trying again can help.

Where it sits: raised by the store backends (``store_*``), the rendezvous
(``rendezvous.protocol``), the configuration parser (``loop.logic.config``) and the worker
launch (``workers.group``); the agent loop
(``loop.agent``) and the CLI map the class, never the message text, to an exit
code from ``torchflex_contract.exit_codes``.
"""

from __future__ import annotations


class RendezvousError(Exception):
    """Base of every error raised while talking to the rendezvous backend."""


class RetryableError(RendezvousError):
    """The condition may clear on its own (backend restarting, peers late)."""


class PermanentError(RendezvousError):
    """Trying again with the same inputs cannot succeed."""


class StoreUnavailableError(RetryableError):
    """The key-value backend could not be reached or dropped the connection."""


class RendezvousTimeoutError(RetryableError):
    """Fewer than the minimum number of nodes joined within the join timeout."""


class RendezvousClosedError(PermanentError):
    """The job's rendezvous was closed because the job finished."""


class JobFailedError(PermanentError):
    """Another node gave up after the job's restart budget was spent."""


class StoreProtocolError(PermanentError):
    """A key held a value this agent cannot parse (version skew or corruption)."""


class ConfigError(ValueError):
    """A flag or environment variable is malformed; the message names the flag."""


class LaunchError(Exception):
    """Workers could not be started; the subclass says whether trying again can help."""


class CommandNotRunnableError(LaunchError):
    """The training command cannot start on this node: permanent, the user's to fix.

    Its executable is missing or not executable, or python's script cannot be
    opened. The message is one line naming the command."""


class SpawnFailedError(LaunchError):
    """The OS refused a new process (out of memory, process limit): retryable."""
