"""Process plumbing shared by the rendezvous and operator-scale benchmarks.

Where it sits: ``benchmarks.rendezvous`` starts a store server and an etcd
with it, ``benchmarks.operator_scale`` its counting API proxy (the operator
itself through ``e2e.operator_proc``); both stop what they started by PID
(``e2e.localproc``, also their free ports and the pinned etcd binary). Every
wait is bounded (``e2e.polling``). The /proc readings of the
operator's memory and CPU are parsed by pure functions in ``_scale_stats``.
"""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

from e2e.polling import poll_until

REPO = Path(__file__).resolve().parents[1]


def start_logged(
    cmd: list[str], log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """Start ``cmd`` with stdout and stderr into ``log``."""
    with log.open("w") as fh:
        return subprocess.Popen(
            cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
            env=env, cwd=REPO,
        )  # fmt: skip


def wait_line(log: Path, needle: str, timeout: float) -> str:
    """The first line of ``log`` containing ``needle``; TimeoutError after ``timeout`` s."""

    def first() -> str | None:
        with contextlib.suppress(FileNotFoundError):
            for line in log.read_text(errors="replace").splitlines():
                if needle in line:
                    return line
        return None

    got = poll_until(first, timeout, 0.1)
    if got.value is None:
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        raise TimeoutError(f"{log.name}: no line with {needle!r} in {timeout:.0f}s\n{tail}")
    return got.value
