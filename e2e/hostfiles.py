"""One line of the machine's /etc/hosts that keeps torch's peer-name lookups off the network.

Where it sits: the harness calls :func:`ensure_loopback_names` once per entry point
that starts torch processes on the host (``tests/conftest.py``, every benchmark's
``BenchCli.parse``, the demo). Pods of the local clusters have their own hosts file
and resolver (``e2e/kubelet``, the real node's CoreDNS); this is about processes on
the host itself.

Why: torch's TCPStore names each peer it accepts or connects to (``getnameinfo``,
for its logs). Its listener is dual-stack, so a loopback peer reads as
``::ffff:127.0.0.1``; glibc's ``files`` backend does not match that against the
``127.0.0.1`` line, and the lookup falls through to the machine's DNS server (seen
with strace: a PTR query for 1.0.0.127.in-addr.arpa per connection). The network
rule says no name may fall through to the machine's resolver. One line naming the
mapped address answers it from the file; nothing else in the file changes.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

HOSTS = Path("/etc/hosts")
MAPPED_LOOPBACK = "::ffff:127.0.0.1"
LINE = f"{MAPPED_LOOPBACK}\tlocalhost\t# torchflex: torch's peer lookups stay in this file\n"


class HostSetupError(RuntimeError):
    """The hosts file lacks the line and this process cannot add it (not root)."""


def names_mapped_loopback(text: str) -> bool:
    """Whether some line of a hosts file names ``::ffff:127.0.0.1``."""
    for raw in text.splitlines():
        fields = raw.split("#", 1)[0].split()
        if len(fields) >= 2 and fields[0] == MAPPED_LOOPBACK:
            return True
    return False


def ensure_loopback_names(hosts: Path = HOSTS) -> bool:
    """Append :data:`LINE` unless the file already names the mapped loopback address.

    Returns True when it wrote the line. Idempotent and safe against a concurrent
    caller (an exclusive ``flock`` of the file while it reads and appends).
    """
    if names_mapped_loopback(hosts.read_text()):
        return False
    try:
        fd = os.open(hosts, os.O_RDWR | os.O_APPEND)
    except PermissionError as exc:
        raise HostSetupError(
            f"{hosts} does not name {MAPPED_LOOPBACK}: torch's peer-name lookups would reach "
            f"the machine's DNS server; as root, append this line: {LINE.strip()}"
        ) from exc
    with os.fdopen(fd, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        text = f.read()
        if names_mapped_loopback(text):
            return False
        f.write(("" if not text or text.endswith("\n") else "\n") + LINE)
    return True
