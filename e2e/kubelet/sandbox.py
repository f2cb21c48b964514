"""Starting one container process in its pod's network and mount namespaces.

Where it sits: the process kubelet's ``agent`` calls :func:`start` per
container. The process joins the pod's network namespace (``nsenter``), gets
a private mount and UTS namespace (``unshare``) where the pod's /etc/hosts,
resolv.conf, termination-log and volumes are bind-mounted, and then execs
the container command, so the PID we hold is the container's main process.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from e2e.cluster.layout import REPO_ROOT
from e2e.kubelet.podspec import Mount

TERMINATION_LOG = "/dev/termination-log"


def hiding_mounts(mounts: list[Mount], needed: list[Path]) -> list[Mount]:
    """Mounts whose target is (an ancestor of) a host path the pod runs from.

    Pods here run from the checkout and its virtualenv on the host; a volume
    mounted over, say, /tmp while the checkout lives under /tmp would hide
    the program, its volumes' sources and the pod's own state directory.
    """
    out = []
    for m in mounts:
        target = Path(m.target)
        if any(path == target or target in path.parents for path in needed):
            out.append(m)
    return out


def _script(hostname: str, mounts: list[Mount], workdir: str) -> str:
    lines = ["set -e", f"hostname {shlex.quote(hostname)}"]
    needed = [REPO_ROOT, (REPO_ROOT / ".venv").resolve(), *(m.source for m in mounts)]
    skipped = hiding_mounts(mounts, needed)
    for m in skipped:
        # The one place this kubelet departs from a real one: the host path
        # stays visible (and writable) instead of the volume. Said in the log.
        note = f"[process-kubelet] not mounting a volume at {m.target}: it would hide {REPO_ROOT}"
        lines.append(f"echo {shlex.quote(note)} >&2")
    for m in (m for m in mounts if m not in skipped):
        target = shlex.quote(m.target)
        if m.source.is_dir():
            lines.append(f"mkdir -p {target}")
        else:
            lines.append(f"[ -e {target} ] || touch {target}")
        lines.append(f"mount --bind {shlex.quote(str(m.source))} {target}")
        if m.read_only:
            lines.append(f"mount -o remount,bind,ro {target}")
    lines.append(f"cd {shlex.quote(workdir)}")
    lines.append('exec "$@"')
    return "\n".join(lines)


def start(
    *,
    netns: str,
    hostname: str,
    argv: list[str],
    env: dict[str, str],
    workdir: str,
    mounts: list[Mount],
    log_path: Path,
) -> subprocess.Popen[bytes]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = log_path.open("ab")
    try:
        return subprocess.Popen(
            [
                "nsenter", f"--net=/run/netns/{netns}", "--",
                "unshare", "--mount", "--uts", "--propagation", "private", "--",
                "sh", "-c", _script(hostname, mounts, workdir), "sh", *argv,
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    finally:
        log.close()
