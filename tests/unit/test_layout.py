"""The repository layout keeps the standard library reachable."""

from __future__ import annotations

import subprocess
import sys
import sysconfig

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
