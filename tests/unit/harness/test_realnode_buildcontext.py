"""The images' content keys (issue 16): a build is skipped only when nothing it
reads changed. The key covers exactly the files the ``.dockerignore`` lets into
the build context, with Docker's rules; and buildah's leftovers of a killed
build are removed, only in the folders the harness named for it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from e2e.realnode import buildcontext, imagebuild
from e2e.realnode.registry import ImagesPaths

REPO = Path(__file__).resolve().parents[3]
IGNORE = """# a comment
*
!pyproject.toml
!agent/
!examples/train_elastic.py
**/__pycache__
**/*.pyc
*.egg-info
"""


def _tree(root: Path) -> Path:
    files = {
        "pyproject.toml": "[project]\n",
        "agent/pkg/mod.py": "x = 1\n",
        "agent/pkg/__pycache__/mod.cpython-311.pyc": "bytecode",
        "agent/pkg/stray.pyc": "bytecode",
        "agent/nested.egg-info/PKG-INFO": "kept: *.egg-info names the root only",
        "examples/train_elastic.py": "print()\n",
        "examples/other.py": "not sent\n",
        "top.egg-info/PKG-INFO": "not sent\n",
        ".venv/lib/big.py": "not sent\n",
        "README.md": "not sent\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "Dockerfile").write_text("FROM base\n")
    (root / "Dockerfile.dockerignore").write_text(IGNORE)
    return root


def _key(root: Path, **args: str) -> str:
    return buildcontext.context_key(
        root, root / "Dockerfile", root / "Dockerfile.dockerignore", args, "sha-of-base"
    )


def test_context_files_follow_dockerignore_rules(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    files = list(buildcontext.context_files(root, buildcontext.parse_ignore(IGNORE)))
    assert files == [
        "agent/nested.egg-info/PKG-INFO",
        "agent/pkg/mod.py",
        "examples/train_elastic.py",
        "pyproject.toml",
    ]


def test_key_changes_with_what_the_build_reads_only(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    key = _key(root, TORCH_INDEX_URL="https://pypi.org/simple")
    assert key == _key(root, TORCH_INDEX_URL="https://pypi.org/simple")
    # Outside the context: the same key.
    (root / "agent/pkg/__pycache__/mod.cpython-311.pyc").write_text("other bytecode")
    (root / "examples/other.py").write_text("changed\n")
    (root / ".venv/lib/big.py").write_text("changed\n")
    assert key == _key(root, TORCH_INDEX_URL="https://pypi.org/simple")
    # A build argument, a source byte, a mode bit, a new file: a new key each.
    assert key != _key(root, TORCH_INDEX_URL="https://download.pytorch.org/whl/cpu")
    keys = {key}
    (root / "agent/pkg/mod.py").write_text("x = 2\n")
    keys.add(_key(root, TORCH_INDEX_URL="https://pypi.org/simple"))
    os.chmod(root / "agent/pkg/mod.py", 0o755)
    keys.add(_key(root, TORCH_INDEX_URL="https://pypi.org/simple"))
    (root / "agent/pkg/new.py").write_text("")
    keys.add(_key(root, TORCH_INDEX_URL="https://pypi.org/simple"))
    (root / "Dockerfile").write_text("FROM base\nRUN true\n")
    keys.add(_key(root, TORCH_INDEX_URL="https://pypi.org/simple"))
    assert len(keys) == 5


def test_project_dockerignores_are_read_and_cover_the_sources() -> None:
    for name in ("operator", "agent"):
        text = (REPO / "docker" / f"{name}.Dockerfile.dockerignore").read_text()
        files = set(buildcontext.context_files(REPO, buildcontext.parse_ignore(text)))
        assert {"pyproject.toml", "constraints.txt", "README.md"} <= files
        assert "agent/torchflex_agent/cli.py" in files
        assert "operator/torchflex_operator/planning/pipeline.py" in files
        assert not any("__pycache__" in f or f.endswith(".pyc") for f in files)
        assert not any(f.startswith((".venv/", ".git/", "tests/")) for f in files)
        assert ("examples/train_elastic.py" in files) == (name == "agent")


def test_unknown_dockerignore_syntax_is_refused() -> None:
    with pytest.raises(buildcontext.IgnoreFileError):
        buildcontext.parse_ignore("*\n!agent/[ab]*.py\n")


def test_buildah_tmp_of_dead_builds_is_removed_and_nothing_else(tmp_path: Path) -> None:
    images = ImagesPaths(tmp_path)
    mine = imagebuild._tmp_dir(images)  # this process: alive
    dead = images.buildah_tmp / f"{os.getpid()}-1"  # same PID, another start time
    (dead / "buildah123" / "blob").parent.mkdir(parents=True)
    (dead / "buildah123" / "blob").write_bytes(b"x" * 1024)
    foreign = images.buildah_tmp / "not-ours"
    foreign.mkdir()
    assert imagebuild.clear_dead_tmp(images) == [dead]
    assert not dead.exists() and mine.is_dir() and foreign.is_dir()
    shutil.rmtree(mine)


def test_working_containers_are_left_alone_while_another_process_builds(tmp_path: Path) -> None:
    images = ImagesPaths(tmp_path)
    other = images.buildah_tmp / f"1-{imagebuild._start_time(1)}"  # PID 1: alive, not us
    other.mkdir(parents=True)
    assert imagebuild.clear_dead_containers(images) is False  # no buildah call made
    assert imagebuild.clear_dead_tmp(images) == [] and other.is_dir()
