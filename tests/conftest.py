"""Fixtures shared by every test tier.

Where it sits: pytest loads this for ``tests/``. ``cluster`` starts the local
control plane once per session (or attaches to one named by
``TORCHFLEX_KUBECONFIG``, e.g. from ``make cluster``) and tears down only
what it started; ``namespace`` gives each test a fresh namespace and deletes
it afterwards. Unit tests never touch these fixtures.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e import hostfiles
from e2e.cluster import Cluster, ensure_up, tear_down
from e2e.cluster.layout import state_dir, toolchain_bin_dir
from tests import toolchain_parts
from tests.support import fresh_namespace


def pytest_configure(config: pytest.Config) -> None:
    """Before any tier starts torch on the host: its peer-name lookups stay in /etc/hosts."""
    try:
        hostfiles.ensure_loopback_names()
    except hostfiles.HostSetupError as exc:
        raise pytest.UsageError(str(exc)) from exc


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the toolchain parts the collected tests run (tests/toolchain_parts.py),
    before the first test: a cold build takes minutes, more than a test's timeout.
    build.sh's progress lines go to the terminal, not into a test's captured output."""
    if session.config.option.collectonly:
        return
    tests = [
        (item.nodeid.split("::", 1)[0], "cluster" in getattr(item, "fixturenames", ()))
        for item in session.items
    ]
    parts = toolchain_parts.build_args(tests)
    if not parts:
        return
    capture = session.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        toolchain_bin_dir(*parts)


_SECONDS_BY_FILE: defaultdict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _SECONDS_BY_FILE[report.nodeid.split("::", 1)[0]] += report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Where the suite's wall time goes, per file (setup, call and teardown):
    the CI time budget is spent here, so every run reports it."""
    slowest = sorted(_SECONDS_BY_FILE.items(), key=lambda kv: kv[1], reverse=True)[:25]
    if not slowest:
        return
    terminalreporter.section("seconds per test file (the 25 slowest)")
    for path, seconds in slowest:
        terminalreporter.write_line(f"{seconds:8.1f}  {path}")


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    given = os.environ.get("TORCHFLEX_KUBECONFIG")
    if given:
        yield Cluster.from_kubeconfig(Path(given))
        return
    root = state_dir()  # .cluster/ or .cluster-N/ for TORCHFLEX_CLUSTER_SLOT=N
    was_up = (root / "cluster.json").exists()
    handle = ensure_up(root)
    try:
        yield handle
    finally:
        if not was_up and not os.environ.get("TORCHFLEX_KEEP_CLUSTER"):
            tear_down(root)


@pytest.fixture()
def namespace(cluster: Cluster) -> Iterator[str]:
    with fresh_namespace(cluster, "t") as name:
        yield name
