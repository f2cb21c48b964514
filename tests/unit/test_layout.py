"""The repository layout: the standard library stays reachable, cluster slots never
share state, and the docs map every product module."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

from e2e.cluster.layout import REPO_ROOT


def test_import_operator_from_repo_root_is_the_stdlib() -> None:
    code = (
        "import operator, torchflex_operator, torchflex_agent, torchflex_contract;"
        "print(operator.__file__); print(operator.attrgetter('x').__class__.__name__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    path, attrgetter = out.stdout.split()
    assert path.startswith(sysconfig.get_paths()["stdlib"])
    assert attrgetter == "attrgetter"
    assert not (REPO_ROOT / "operator" / "__init__.py").exists()
    assert not (REPO_ROOT / "agent" / "__init__.py").exists()


def _layout_in_slot(slot: str) -> subprocess.CompletedProcess[str]:
    code = (
        "from e2e.cluster import layout as l;"
        "print(l.BRIDGE, l.GATEWAY_IP, l.SERVICE_CIDR, l.KWOK_POD_CIDR, l.KWOK_NODE_IP,"
        " l.PROCESS_NODE_IP_PREFIX, l.NETNS_PREFIX, l.state_dir().name)"
    )
    env = {"PATH": "/usr/bin:/bin", "TORCHFLEX_CLUSTER_SLOT": slot}
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


def test_cluster_slots_never_share_addresses_or_state() -> None:
    seen: list[list[str]] = []
    for slot in ("0", "1", "7"):
        out = _layout_in_slot(slot)
        assert out.returncode == 0, out.stderr
        seen.append(out.stdout.split())
    assert seen[0] == [
        "tfbr0",
        "10.213.0.1",
        "10.214.0.0/16",
        "127.64.0.1/16",
        "127.63.0.1",
        "127.10.0",
        "tfpod0-",
        ".cluster",
    ]
    assert seen[1][0] == "tfbr1" and seen[1][-1] == ".cluster-1"
    for column in zip(*seen, strict=True):
        assert len(set(column)) == len(column), column
    # No slot's pod range overlaps another slot's service range.
    pod_ranges = {row[1].rsplit(".", 2)[0] for row in seen}
    svc_ranges = {row[2].rsplit(".", 2)[0] for row in seen}
    assert not pod_ranges & svc_ranges


def test_bad_cluster_slot_is_refused_with_the_variable_name() -> None:
    out = _layout_in_slot("9")
    assert out.returncode != 0
    assert "TORCHFLEX_CLUSTER_SLOT must be an integer 0-7" in out.stderr


def _modules(package: Path) -> set[str]:
    """Every module's file name, those of the package's own subpackages too."""
    return {p.name for p in package.rglob("*.py") if p.name != "__init__.py"}


def _named_in(doc: Path) -> set[str]:
    return set(re.findall(r"`([a-z0-9_]+\.py)`", doc.read_text()))


def test_every_product_module_has_its_row_in_the_docs() -> None:
    """A newcomer finds each room from docs: the operator's map (docs/api.md, "The
    operator in the code") and the agent's (docs/agent.md) name every module."""
    root = REPO_ROOT
    for package, doc in (
        (root / "operator" / "torchflex_operator", root / "docs" / "api.md"),
        (root / "agent" / "torchflex_agent", root / "docs" / "agent.md"),
    ):
        missing = _modules(package) - _named_in(doc)
        assert not missing, f"{doc.name} does not name {sorted(missing)}"


# Size and privacy rules for all product code (issue 27).
SIZED = ("agent", "contract", "operator", "submit")
PRIVATE_CHECKED = ("agent", "contract", "operator", "submit")
MAX_CLASS_LINES = 300
MAX_FUNCTION_LINES = 100
OUR_ROOTS = ("torchflex_agent", "torchflex_operator", "torchflex_contract", "torchflex_torchx")


def _sources(roots: tuple[str, ...]) -> list[Path]:
    return sorted(p for root in roots for p in (REPO_ROOT / root).rglob("*.py"))


def test_no_class_over_300_lines_and_no_function_over_100_lines() -> None:
    too_long = []
    for path in _sources(SIZED):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                limit = MAX_CLASS_LINES
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                limit = MAX_FUNCTION_LINES
            else:
                continue
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > limit:
                where = path.relative_to(REPO_ROOT)
                too_long.append(f"{where}:{node.lineno} {node.name}: {lines} lines > {limit}")
    assert not too_long, "\n".join(too_long)


def _private_imports(path: Path) -> list[str]:
    """Names with a leading underscore this module takes from another of ours: imported
    (``from m import _x``, ``import m._x``; TYPE_CHECKING blocks too) or read off an
    imported module (``m._x``)."""
    found = []
    aliases: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            ours = node.level > 0 or (node.module or "").split(".")[0] in OUR_ROOTS
            parts = (node.module or "").split(".")
            for alias in node.names if ours else ():
                if _private(alias.name) or any(_private(part) for part in parts):
                    found.append(f"{node.lineno}: from {node.module} import {alias.name}")
                aliases.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] not in OUR_ROOTS:
                    continue
                if any(_private(part) for part in alias.name.split(".")):
                    found.append(f"{node.lineno}: import {alias.name}")
                aliases.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (
            isinstance(node, ast.Attribute)
            and _private(node.attr)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
        ):
            found.append(f"{node.lineno}: {node.value.id}.{node.attr}")
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_module_imports_another_modules_private_name() -> None:
    found = [
        f"{path.relative_to(REPO_ROOT)}:{hit}"
        for path in _sources(PRIVATE_CHECKED)
        for hit in _private_imports(path)
    ]
    assert not found, "\n".join(found)


def test_the_private_name_rule_bites(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "from torchflex_agent.loop import agent\n"
        "if TYPE_CHECKING:\n"
        "    from torchflex_operator.planner import _Pass\n"
        "import torchflex_agent.loop._hidden\n"
        "x = agent._session\n"
        "y = agent.__name__\n"
    )
    assert sorted(hit.split(":")[0] for hit in _private_imports(module)) == ["4", "5", "6"]
