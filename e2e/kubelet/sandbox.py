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

from e2e.kubelet.podspec import Mount

TERMINATION_LOG = "/dev/termination-log"


def _script(hostname: str, mounts: list[Mount], workdir: str) -> str:
    lines = ["set -e", f"hostname {shlex.quote(hostname)}"]
    for m in mounts:
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
