"""The real-node tier is part of ``make test`` (issue 16): pure checks of the
Makefile's rules and pytest's configuration, so neither can quietly drop it.

Where it sits: ``tests/unit``; reads the Makefile and ``pyproject.toml``
(``make -n``: nothing is built or run).
"""

from __future__ import annotations

import fnmatch
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
# pytest's own default, which applies when pyproject sets none.
PYTEST_NORECURSEDIRS = [
    "*.egg",
    ".*",
    "_darcs",
    "build",
    "CVS",
    "dist",
    "node_modules",
    "venv",
    "{arch}",
]


def _dry_run(target: str) -> list[str]:
    out = subprocess.run(
        ["make", "-n", "--no-print-directory", target],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return out.stdout.splitlines()


def test_no_directory_of_tests_is_hidden_from_collection() -> None:
    ini = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    patterns = ini.get("norecursedirs", PYTEST_NORECURSEDIRS)
    dirs = [p for p in (REPO / "tests").rglob("*") if p.is_dir() and p.name != "__pycache__"]
    hidden = [
        str(d.relative_to(REPO))
        for d in dirs
        if any(fnmatch.fnmatch(d.name, pat) for pat in patterns)
    ]
    assert (REPO / "tests" / "realnode").is_dir()
    assert ini["testpaths"] == ["tests"]
    assert hidden == []


def test_make_test_sets_up_the_real_node_parts_before_pytest_runs_every_tier() -> None:
    lines = _dry_run("test")
    setup = [i for i, line in enumerate(lines) if "e2e/toolchain/build.sh --real-nodes" in line]
    lanes = [i for i, line in enumerate(lines) if line.endswith("bash scripts/test-all.sh")]
    assert setup and lanes, lines
    assert setup[0] < lanes[0]
    # Both lanes together run lint and every directory of tests/, the real-node tier
    # on a cluster slot of its own.
    script = (REPO / "scripts" / "test-all.sh").read_text()
    assert 'make --no-print-directory lint >"$lint_log" 2>&1 &\n' in script
    assert 'TORCHFLEX_CLUSTER_SLOT=$real_slot "$py" -m pytest tests/realnode ' in script
    assert 'env -u TORCHFLEX_IMAGES_DIR "$py" -m pytest tests --ignore=tests/realnode\n' in script
    assert "((lint_rc == 0 && main_rc == 0 && real_rc == 0))" in script


def test_ci_installs_the_real_node_parts_with_the_rest_of_its_dependencies() -> None:
    ci = (REPO / ".ci" / "run").read_text()
    assert "make venv toolchain real-node-toolchain\n" in ci
    assert ci.rstrip().endswith("make test")


def test_a_cluster_without_a_real_node_leaves_the_shared_images_folder_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lane 1's cluster (no real node) tears down while lane 2's registry serves from
    $TORCHFLEX_IMAGES_DIR: its registry keeps running (seen in CI: lane 1's start-up
    stopped lane 2's registry, and every push was refused)."""
    from e2e.cluster import processes
    from e2e.polling import poll_until
    from e2e.realnode import real_node_down
    from e2e.realnode.registry import NAME, ImagesPaths

    images = ImagesPaths(tmp_path / "images")
    for d in (images.pids, images.logs):
        d.mkdir(parents=True)
    monkeypatch.setenv("TORCHFLEX_IMAGES_DIR", str(images.root))
    processes.spawn(NAME, ["sleep", "60"], images.pids, images.logs)
    try:
        # Until the child has exec'd, its cmdline is still the parent's (bounded wait).
        assert poll_until(lambda: processes.alive(images.pids, NAME), 10.0, 0.02)
        real_node_down(tmp_path / "cluster-without-a-real-node")
        assert processes.alive(images.pids, NAME)
    finally:
        processes.stop(images.pids, NAME)
    assert not processes.alive(images.pids, NAME)
