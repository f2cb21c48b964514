"""The toolchain parts a test session builds before its first test (issue 31).

Where it sits: ``tests/unit/harness``; pure checks of ``tests/toolchain_parts.py``,
the table ``tests/conftest.py`` reads to build what the collected tests run.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests import toolchain_parts as tp

REPO = Path(__file__).resolve().parents[3]


def test_every_path_of_the_table_exists_and_names_build_sh_parts() -> None:
    for path, parts in tp.BY_PATH.items():
        assert (REPO / path).is_dir() if path.endswith("/") else (REPO / path).is_file(), path
        assert set(parts) <= set(tp.PARTS), path


def test_the_parts_are_build_sh_parts_in_its_order() -> None:
    script = (REPO / "e2e" / "toolchain" / "build.sh").read_text()
    found = re.search(r"^all_parts=\(([^)]*)\)$", script, re.MULTILINE)
    assert found
    assert (*found.group(1).split(), "real-nodes") == tp.PARTS


def test_a_test_gets_the_control_plane_from_the_cluster_fixture_and_its_path_adds_the_rest() -> (
    None
):
    assert tp.parts_for("tests/unit/agent/test_x.py", uses_cluster=False) == set()
    assert tp.parts_for("tests/unit/install/test_chart_render.py", uses_cluster=False) == {tp.TOOLS}
    assert tp.parts_for("tests/e2e/test_elasticity.py", uses_cluster=True) == {tp.CONTROL_PLANE}
    assert tp.parts_for("tests/e2e/test_kueue.py", uses_cluster=True) == {
        tp.CONTROL_PLANE,
        tp.KUEUE,
    }
    assert tp.parts_for("tests/realnode/test_network_policy.py", uses_cluster=True) == {
        tp.CONTROL_PLANE,
        tp.TOOLS,
        tp.REAL_NODES,
        tp.KUBE_ROUTER,
    }
    # A file's own entry matches that file only, not one whose name starts the same.
    assert tp.parts_for("tests/e2e/test_kueue.pyc", uses_cluster=False) == set()


def test_a_session_builds_the_union_in_build_sh_order_and_nothing_for_pure_tests() -> None:
    session = [
        ("tests/e2e/test_autoscaler.py", True),
        ("tests/unit/install/test_helm_build.py", False),
        ("tests/e2e/test_tenancy.py", True),
    ]
    assert tp.build_args(session) == [tp.CONTROL_PLANE, tp.TOOLS, tp.KUBE_ROUTER, tp.AUTOSCALER]
    # build.sh without a part builds every one: a session of pure tests must not call it so.
    assert tp.build_args([("tests/unit/agent/test_x.py", False)]) == []
