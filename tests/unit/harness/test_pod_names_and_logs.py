"""Pure parts of the process kubelet's name lookup files and log endpoint."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from e2e.kubelet.logserver import newest_log, tail_offset
from e2e.kubelet.podspec import nsswitch_conf, resolv_conf

HOST_NSSWITCH = "passwd:  files systemd\nhosts:   files dns\nnetworks: files\n"


def test_resolv_conf_has_search_domains_and_no_nameserver() -> None:
    text = resolv_conf("team-a")
    assert "nameserver" not in text
    assert "search team-a.svc.cluster.local svc.cluster.local cluster.local" in text


def test_nsswitch_keeps_the_host_databases_and_makes_hosts_files_only() -> None:
    lines = nsswitch_conf(HOST_NSSWITCH).splitlines()
    assert "passwd:  files systemd" in lines
    assert "networks: files" in lines
    assert [ln.split() for ln in lines if ln.startswith("hosts:")] == [["hosts:", "files"]]
    assert nsswitch_conf("").strip().split() == ["hosts:", "files"]


@pytest.mark.parametrize(
    ("data", "lines", "want"),
    [
        (b"a\nb\nc\n", 1, b"c\n"),
        (b"a\nb\nc\n", 2, b"b\nc\n"),
        (b"a\nb\nc\n", 10, b"a\nb\nc\n"),
        (b"a\nb\nc", 1, b"c"),  # a last line still being written
        (b"a\nb\nc\n", 0, b""),
        (b"", 3, b""),
    ],
)
def test_tail_offset(tmp_path: Path, data: bytes, lines: int, want: bytes) -> None:
    path = tmp_path / "log"
    path.write_bytes(data)
    assert data[tail_offset(path, lines) :] == want


def test_newest_log_of_a_pod_name_after_a_kubelet_restart(tmp_path: Path) -> None:
    """A pod the current kubelet process never ran: its newest directory wins."""
    old, new = tmp_path / "ns_p_uid1", tmp_path / "ns_p_uid2"
    for d in (old, new):
        d.mkdir()
        (d / "main.log").write_text(d.name)
    os.utime(old, (1, 1))
    (tmp_path / "ns_p-other_uid3").mkdir()
    assert newest_log(tmp_path, "ns", "p", "main") == new / "main.log"
    assert newest_log(tmp_path, "ns", "p", "sidecar") is None
    assert newest_log(tmp_path, "ns", "q", "main") is None
