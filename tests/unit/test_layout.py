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


OPERATOR = REPO_ROOT / "operator" / "torchflex_operator"
MAX_CLASS_LINES = 300
MAX_FUNCTION_LINES = 100


def _operator_trees() -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text(), str(p))) for p in sorted(OPERATOR.rglob("*.py"))]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_operator_rooms_stay_small_and_keep_their_privates() -> None:
    """The operator's product code (issue 27): no class over 300 lines, no function
    over 100, and no module imports another module's private name (``_X``), under
    ``TYPE_CHECKING`` or not, nor reaches one through a module it imported."""
    problems: list[str] = []
    for path, tree in _operator_trees():
        where = path.relative_to(REPO_ROOT)
        modules: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                bound = MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES
                if size > bound:
                    problems.append(
                        f"{where}:{node.lineno} {node.name} is {size} lines (> {bound})"
                    )
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torchflex"):
                for alias in node.names:
                    if _private(alias.name):
                        problems.append(f"{where}:{node.lineno} imports {node.module}.{alias.name}")
                    modules.add(alias.asname or alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("torchflex"):
                        modules.add(alias.asname or alias.name.split(".")[0])
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in modules
                and _private(node.attr)
            ):
                problems.append(f"{where}:{node.lineno} reaches {node.value.id}.{node.attr}")
    assert not problems, "\n".join(problems)
