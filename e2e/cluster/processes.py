"""Starting and stopping the cluster's daemons by PID, never by name.

Where it sits: ``controlplane`` starts each daemon through :func:`spawn`,
which records its PID and command line under ``.cluster/pids``;
:func:`stop_all` signals exactly those PIDs (after checking the PID still
runs the same command, so a reused PID is never touched).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path


def _cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [p.decode(errors="replace") for p in raw.split(b"\0") if p]


def spawn(
    name: str,
    argv: list[str],
    pids: Path,
    logs: Path,
    env: dict[str, str] | None = None,
    *,
    pass_fds: tuple[int, ...] = (),
) -> int:
    """Start a daemon in its own session, output to ``logs/<name>.log``;
    ``pass_fds`` stay open in it (a lock it holds for as long as it runs)."""
    log = (logs / f"{name}.log").open("ab")
    proc = subprocess.Popen(
        argv,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env=env,
        pass_fds=pass_fds,
    )
    log.close()
    (pids / f"{name}.json").write_text(json.dumps({"pid": proc.pid, "argv": argv}))
    return proc.pid


def recorded(pids: Path, name: str) -> tuple[int, list[str]]:
    """The PID and command line recorded for ``name`` (``FileNotFoundError`` if none)."""
    data = json.loads((pids / f"{name}.json").read_text())
    return int(data["pid"]), [str(a) for a in data["argv"]]


def alive(pids: Path, name: str) -> bool:
    record = pids / f"{name}.json"
    if not record.exists():
        return False
    data = json.loads(record.read_text())
    return bool(_cmdline(int(data["pid"])) == data["argv"])


def exit_status_hint(logs: Path, name: str, lines: int = 15) -> str:
    """The tail of a daemon's log, for error messages."""
    path = logs / f"{name}.log"
    if not path.exists():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def stop(pids: Path, name: str, grace_s: float = 10.0) -> None:
    record = pids / f"{name}.json"
    if not record.exists():
        return
    data = json.loads(record.read_text())
    pid, argv = int(data["pid"]), data["argv"]
    if _cmdline(pid) == argv:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and _cmdline(pid) == argv:
            time.sleep(0.05)
        if _cmdline(pid) == argv:
            os.kill(pid, signal.SIGKILL)
    record.unlink()


def stop_all(pids: Path, order: list[str]) -> None:
    """Stop the named daemons in order, then any other recorded one."""
    for name in order:
        stop(pids, name)
    for record in sorted(pids.glob("*.json")):
        stop(pids, record.stem)
