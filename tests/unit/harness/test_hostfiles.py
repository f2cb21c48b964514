"""The /etc/hosts line that keeps torch's peer-name lookups off the network (e2e.hostfiles).

Pure checks on files of this test's own; the machine's file is checked by
tests/integration/agent/test_store_resolver.py (a store's lookups answered from it).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from e2e import hostfiles


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("127.0.0.1 localhost\n", False),
        ("127.0.0.1 localhost\n::ffff:127.0.0.1 localhost\n", True),
        ("::ffff:127.0.0.1\tlocalhost\t# a comment\n", True),
        ("# ::ffff:127.0.0.1 localhost\n", False),  # commented out
        ("::ffff:127.0.0.1\n", False),  # an address without a name names nothing
        ("::1 localhost ip6-localhost\n", False),
        ("", False),
    ],
)
def test_names_mapped_loopback(text: str, named: bool) -> None:
    assert hostfiles.names_mapped_loopback(text) is named


def test_appends_the_line_once_and_keeps_the_rest(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n10.1.2.3 other")  # no newline at the end
    assert hostfiles.ensure_loopback_names(hosts) is True
    assert hostfiles.ensure_loopback_names(hosts) is False
    assert hosts.read_text() == "127.0.0.1 localhost\n10.1.2.3 other\n" + hostfiles.LINE


def test_a_file_that_names_it_already_is_left_alone(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("::ffff:127.0.0.1 localhost.localdomain\n")
    assert hostfiles.ensure_loopback_names(hosts) is False
    assert hosts.read_text() == "::ffff:127.0.0.1 localhost.localdomain\n"


def test_without_the_right_to_write_it_says_the_line_to_add(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n")

    def refuse(*_args: object, **_kwargs: object) -> int:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "open", refuse)
    with pytest.raises(hostfiles.HostSetupError, match=r"::ffff:127\.0\.0\.1\tlocalhost"):
        hostfiles.ensure_loopback_names(hosts)
    monkeypatch.undo()
    assert hosts.read_text() == "127.0.0.1 localhost\n"
