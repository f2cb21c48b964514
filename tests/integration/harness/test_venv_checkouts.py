"""Two checkouts on one machine each run their own code from one shared environment.

Where it sits: integration tier, real ``scripts/venv.sh`` on two real clones
of this repository (the script under test copied from this working tree).
The shared dependency environment must already exist (``make venv`` made it
for this checkout), so this takes seconds, not a torch download.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def _run(*argv: str | Path, cwd: Path | None = None) -> str:
    out = subprocess.run(
        [str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, f"{argv} failed:\n{out.stdout}\n{out.stderr}"
    return out.stdout.strip()


@pytest.fixture()
def clones(tmp_path: Path) -> Iterator[list[Path]]:
    made = []
    for name in ("a", "b"):
        dest = tmp_path / name
        _run("git", "clone", "--quiet", REPO, dest)
        shutil.copyfile(REPO / "scripts" / "venv.sh", dest / "scripts" / "venv.sh")
        made.append(dest)
    try:
        yield made
    finally:
        for dest in made:
            link = dest / ".venv"
            if link.is_symlink():
                # The clone's own small layer in the cache goes with the clone.
                shutil.rmtree(link.resolve(), ignore_errors=True)


def _origin(python: Path, module: str) -> str:
    return _run(python, "-c", f"import {module}; print({module}.__file__)")


def test_each_checkout_imports_its_own_code(clones: list[Path]) -> None:
    envs = [Path(_run("bash", c / "scripts" / "venv.sh")) for c in clones]
    assert envs[0] != envs[1]
    for clone in clones:
        python = clone / ".venv" / "bin" / "python"
        assert _origin(python, "torchflex_operator").startswith(f"{clone}/operator/")
        assert _origin(python, "torchflex_agent").startswith(f"{clone}/agent/")
        # The heavy dependencies come from the shared environment, not a copy.
        assert "/venvs/" in _origin(python, "torch")
        # Console scripts run this checkout's interpreter, so its code.
        for script in ("torchflex-agent", "torchrun", "pytest", "lint-imports"):
            first = (clone / ".venv" / "bin" / script).read_text().splitlines()[0]
            assert first == f"#!{(clone / '.venv').resolve()}/bin/python", script
        _run(clone / ".venv" / "bin" / "torchflex-operator", "--help")
    # The first clone's environment still points at the first clone after the
    # second one's `make venv`, and so does this checkout's.
    assert _origin(clones[0] / ".venv" / "bin" / "python", "torchflex_operator").startswith(
        str(clones[0])
    )
    own = _origin(REPO / ".venv" / "bin" / "python", "torchflex_operator")
    assert own.startswith(f"{REPO}/operator/")


def test_rerun_swaps_the_link_and_keeps_the_environment(clones: list[Path]) -> None:
    first = _run("bash", clones[0] / "scripts" / "venv.sh")
    again = _run("bash", clones[0] / "scripts" / "venv.sh")
    assert first == again
    assert (clones[0] / ".venv").resolve() == Path(first)
    assert not list(clones[0].glob(".venv.tmp.*"))
