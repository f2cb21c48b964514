"""pyproject's dependency lists: the operator declares only what it imports; stubs are pinned.

The operator image installs ``.[operator]`` (docker/operator.Dockerfile), so an
unused entry there only grows the image; an unpinned stub lets mypy's verdict
change under a machine that happens to resolve a newer one.
"""

from __future__ import annotations

import ast
import re
import tomllib

from e2e.cluster.layout import REPO_ROOT

PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
EXTRAS: dict[str, list[str]] = PYPROJECT["project"]["optional-dependencies"]
# Distribution name -> the top-level module it provides, where they differ.
MODULE_OF = {"prometheus-client": "prometheus_client", "pyyaml": "yaml"}


def distribution(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert match, requirement
    return match.group(0).lower()


def imported_modules(package: str) -> set[str]:
    found: set[str] = set()
    for path in (REPO_ROOT / "operator" / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module.split(".")[0])
    return found


def test_every_operator_dependency_is_imported_by_the_operator() -> None:
    imported = imported_modules("torchflex_operator")
    unused = [
        req
        for req in EXTRAS["operator"]
        if MODULE_OF.get(distribution(req), distribution(req).replace("-", "_")) not in imported
    ]
    assert not unused, f"declared for the operator but never imported there: {unused}"


def test_type_stubs_are_pinned_exactly() -> None:
    stubs = [
        req for extra in EXTRAS.values() for req in extra if distribution(req).startswith("types-")
    ]
    assert stubs, "no stub packages found: the test reads the wrong list"
    loose = [req for req in stubs if not re.fullmatch(r"[A-Za-z0-9._-]+==[0-9][0-9A-Za-z.]*", req)]
    assert not loose, f"stub packages without an exact pin: {loose}"
