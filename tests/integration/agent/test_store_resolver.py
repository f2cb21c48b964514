"""The store server looks up every accepted connection's peer: why its pod's resolver is loopback.

torch's TCPStore server looks up each accepted peer's name (reverse DNS, for
its log) on its one event-loop thread, before it serves that connection: each
agent's connect costs the store a DNS round trip, and a lost answer stalls
every client of the store while the resolver waits (glibc's default: 5 s,
2 tries). At 1,024 agents that froze the store past the agents' 2 s call
deadline. The operator's store pod therefore resolves through loopback,
where nothing answers and a lookup fails at once (``backends.STORE_DNS``,
unit-tested with the manifests), and ``torchflex-agent store`` run anywhere
else makes a lookup one 1 s try (``store_server.RESOLVER_OPTIONS``).

Here the store runs in a private mount namespace whose resolv.conf names a
DNS server this test runs on a loopback address; it answers every query "no
such name", as the machine's resolver does for 127.0.0.1, and counts them.
Clients run with a resolver that refuses at once (nothing listens on
theirs), so only the store's queries are counted and none leaves the machine.
Needs root (a mount namespace, port 53).

The machine's /etc/hosts names the mapped loopback address torch sees its
loopback peers as (``e2e.hostfiles``), so a store on the host answers these
lookups from the file: the first test gives the store a hosts file without that
line, to show the lookups themselves; the second shows the line keeps them off
any DNS server.
"""

from __future__ import annotations

import random
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.hostfiles import names_mapped_loopback
from e2e.localproc import stop_process
from tests.integration.agent.tfagent_helpers import AGENT_BIN, PYTHON, spawn

# Loopback addresses of this test's own: the store's DNS server, and one
# nobody listens on for the clients (their lookups are refused at once).
# Drawn per run, so two runs of this test at once never share port 53.
_NET = f"127.53.{random.randrange(256)}"
STORE_DNS = f"{_NET}.1"
CLIENT_DNS = f"{_NET}.2"
CLIENTS = 3

# Needs root and unshare(1) (a private mount namespace, port 53), as the other
# tiers on the local control plane do: not met, it fails rather than skips.


class NxDomainDns:
    """A UDP server on ``STORE_DNS``:53 that counts queries and answers each NXDOMAIN."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((STORE_DNS, 53))
        self.sock.settimeout(0.2)
        self.queries = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                query, peer = self.sock.recvfrom(4096)
            except TimeoutError:
                continue
            with self._lock:
                self.queries += 1
            if len(query) >= 12:
                # Same id and question; flags: a response, recursion
                # available, rcode 3 (no such name); no records.
                self.sock.sendto(query[:2] + b"\x81\x83" + query[4:], peer)

    def count(self) -> int:
        with self._lock:
            return self.queries

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


def _in_namespace(conf: Path, cmd: list[str], hosts: Path | None = None) -> list[str]:
    """``cmd`` with ``conf`` bind-mounted over /etc/resolv.conf (and ``hosts`` over
    /etc/hosts, when given) in a private mount namespace."""
    script = 'mount --bind "$0" /etc/resolv.conf && exec "$@"'
    if hosts is not None:
        script = f'mount --bind "{hosts}" /etc/hosts && {script}'
    # The store's own setting is under test: nothing inherited may stand in for it.
    return [
        "unshare",
        "--mount",
        "--",
        "sh",
        "-c",
        script,
        str(conf),
        "env",
        "-u",
        "RES_OPTIONS",
        *cmd,
    ]


@pytest.fixture()
def dns() -> Iterator[NxDomainDns]:
    server = NxDomainDns()
    try:
        yield server
    finally:
        server.close()


def _connect_once(conf: Path, port: int) -> str:
    code = (
        "from torchflex_agent.stores.tcp import TCPKVStore\n"
        f"s = TCPKVStore('127.0.0.1', {port}, connect_timeout=30.0)\n"
        "s.set('k', b'v')\n"
        "print(s.get('k'))\n"
    )
    out = subprocess.run(
        _in_namespace(conf, [PYTHON, "-c", code]),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def _store_queries(dns: NxDomainDns, tmp_path: Path, hosts: Path | None) -> int:
    """The DNS queries the store makes while ``CLIENTS`` clients connect, one at a time."""
    store_conf = tmp_path / "store-resolv.conf"
    store_conf.write_text(f"nameserver {STORE_DNS}\n")
    client_conf = tmp_path / "client-resolv.conf"
    client_conf.write_text(f"nameserver {CLIENT_DNS}\noptions attempts:1 timeout:1\n")
    cmd = [AGENT_BIN, "store", "--host", "127.0.0.1", "--port", "0"]
    log = spawn(_in_namespace(store_conf, cmd, hosts), "store")
    try:
        _, line = log.wait_for(lambda s: "listening on" in s, 60)
        port = int(line.rsplit(":", 1)[1])
        # The loop thread serves a connection only after its lookup of the
        # peer was answered (and counted here), one connection at a time:
        # after this first client's reply, the start-up's lookups are counted.
        assert _connect_once(client_conf, port) == "b'v'"
        before = dns.count()
        replies = [_connect_once(client_conf, port) for _ in range(CLIENTS)]
        assert replies == ["b'v'"] * CLIENTS
        return dns.count() - before
    finally:
        stop_process(log.proc)


def test_the_store_looks_up_every_connection(dns: NxDomainDns, tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1\tlocalhost\n")  # a stock file: no mapped loopback line
    assert _store_queries(dns, tmp_path, hosts) == CLIENTS


def test_the_hosts_line_answers_them_from_the_file(dns: NxDomainDns, tmp_path: Path) -> None:
    # tests/conftest.py put the line in the machine's file before any test ran.
    assert names_mapped_loopback(Path("/etc/hosts").read_text())
    assert _store_queries(dns, tmp_path, None) == 0
