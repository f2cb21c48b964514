"""When the agent starts as PID 1 of its container: a minimal init in front of it.

Where it sits: ``cli.main`` calls :func:`become_init_if_pid1` first, before
any thread exists. In a container (the agent image's ``torchflex-agent --``
is the container's command) the agent is PID 1 of the pod's PID namespace,
and PID 1 has a duty nothing else in the agent does: every process orphaned
in the container is re-parented to it and stays a zombie until PID 1 waits
for it (a DataLoader worker whose trainer died, a shell's background job, a
``kubectl exec`` leftover). The agent itself waits only for the children it
started (``subprocess``), and a catch-all ``waitpid(-1)`` in the agent would
steal their exit statuses. So, as PID 1, the process forks: the child goes
on as the agent (PID 2, unchanged), and PID 1 stays this small loop, as tini
or Docker's ``--init`` would: it forwards every catchable signal to the
agent (the kubelet's SIGTERM, a user's SIGINT), reaps whatever exits, and
leaves with the agent's exit code (128 + N if a signal N killed it), so the
pod's exit code and the termination message are the agent's own.

Nothing happens when the agent is not PID 1 (a plain process, the process
kubelet's pods, a pod with ``shareProcessNamespace``, where the pause
process is PID 1 and reaps).
"""

from __future__ import annotations

import contextlib
import os
import signal
from typing import NoReturn

# Every signal the kernel lets a process catch, except SIGCHLD (ours: it means
# "reap") and the job-control stops a terminal sends (meaningless here).
FORWARDED = frozenset(signal.valid_signals()) - {
    signal.SIGKILL,
    signal.SIGSTOP,
    signal.SIGCHLD,
    signal.SIGTSTP,
    signal.SIGTTIN,
    signal.SIGTTOU,
}


def exit_code(wait_status: int) -> int:
    """The shell's convention: the exit code, or 128 + N for death by signal N."""
    code = os.waitstatus_to_exitcode(wait_status)
    return code if code >= 0 else 128 - code


def become_init_if_pid1() -> None:
    """Return at once as the agent; as PID 1, fork and never return in the parent."""
    if os.getpid() != 1:
        return
    # The kernel drops a signal sent to a namespace's init whose disposition is the
    # default (the kubelet's SIGTERM, until PID 1 has its handlers), but never a
    # blocked one: it stays pending and reaches the handler once unblocked.
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    agent = os.fork()
    if agent == 0:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
        return
    _init(agent)


def _init(agent: int) -> NoReturn:
    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):  # exited: the loop below sees it
            os.kill(agent, signum)

    for sig in FORWARDED:
        try:
            signal.signal(sig, forward)
        except (OSError, ValueError):
            continue  # not settable on this platform (e.g. real-time signals in use)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)  # what came meanwhile goes on now
    while True:
        # Blocking wait for any child; a forwarded signal interrupts it and
        # Python retries it (PEP 475). Orphans re-parented to us end here too.
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(0)  # no child at all: the agent is gone without a status
        if pid == agent:
            os._exit(exit_code(status))
