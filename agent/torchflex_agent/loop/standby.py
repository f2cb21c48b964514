"""A warm spare's wait: stay out of the rendezvous until the pod is promoted.

Where it sits: ``loop.agent.ElasticAgent`` calls :func:`stand_by` (which
calls :func:`wait_for_promotion`) once, after its fork server started and its
store connection opened, before it first joins the rendezvous. The operator
gives spare pods (only them) the file ``env.STANDBY_FILE``, a downward-API
projection of the pod's ``torchflex.io/standby`` annotation; promoting the
spare is one annotation patch, which the kubelet writes into the file. The agent polls that local
file (no server involved) and goes on as any other agent once it reads
anything but ``env.STANDBY_TRUE``.

:func:`is_standby` is the pure decision; a missing or unreadable file is
"not a spare", so a wrong path can never leave an agent waiting forever.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchflex_contract import env as tfenv

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.05
"""Between two reads of the file: a promotion costs at most this much extra
latency, and the read is one small local file (no server)."""

WAITING_MESSAGE = "standby: warm spare, waiting for promotion"
"""Logged (with the file) once the wait starts, and the agent's report message
meanwhile. The benchmarks and the e2e scenario match its start."""


def is_standby(content: str | None) -> bool:
    """Whether the standby file's ``content`` (None: no file) keeps the agent waiting."""
    return content is not None and content.strip() == tfenv.STANDBY_TRUE


def read_standby(path: Path) -> str | None:
    """The file's text, or None when it cannot be read (missing, a directory, not text)."""
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def wait_for_promotion(path: Path, stop: threading.Event) -> float | None:
    """Wait while ``path`` reads ``true``; seconds waited, or None if ``stop`` was set first.

    Returns 0.0 at once (and logs nothing) when the agent is not a spare.
    The caller's SIGTERM handler sets ``stop``: the wait ends within one poll.
    """
    if not is_standby(read_standby(path)):
        return 0.0
    log.info("%s (%s)", WAITING_MESSAGE, path)
    began = time.monotonic()
    while not stop.wait(POLL_INTERVAL_S):
        if not is_standby(read_standby(path)):
            waited = time.monotonic() - began
            log.info("promoted after %.1f s in standby: joining", waited)
            return waited
    return None


def stand_by(standby_file: str | None, stop: threading.Event, update: Callable[..., Any]) -> bool:
    """A warm spare waits here until promoted; False if ``stop`` (SIGTERM) came first.

    Everything that makes no member is done by now (fork server importing,
    store open, master store and its torch import ready), so a promoted
    spare only joins. Meanwhile the report (``update`` changes its fields)
    stays ``Init`` at round -1, as a pod waiting to join, with the standby
    line as its message.
    """
    if standby_file is None:
        return True
    path = Path(standby_file)
    if not is_standby(read_standby(path)):
        return True
    update(message=WAITING_MESSAGE)
    waited = wait_for_promotion(path, stop)
    update(message="")
    return waited is not None
