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
    assert "make --no-print-directory lint\n" in script
    assert 'TORCHFLEX_CLUSTER_SLOT=$real_slot "$py" -m pytest tests/realnode ' in script
    assert '"$py" -m pytest tests --ignore=tests/realnode\n' in script
    assert "((lint_rc == 0 && main_rc == 0 && real_rc == 0))" in script


def test_ci_installs_the_real_node_parts_with_the_rest_of_its_dependencies() -> None:
    ci = (REPO / ".ci" / "run").read_text()
    assert "make venv toolchain real-node-toolchain\n" in ci
    assert ci.rstrip().endswith("make test")
