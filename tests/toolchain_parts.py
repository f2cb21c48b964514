"""Which parts of the pinned toolchain (``e2e/toolchain/build.sh``) a test runs.

Where it sits: ``tests/conftest.py`` builds the parts the collected tests need
before the first one starts, so a tier run on its own (``pytest tests/e2e``
after ``make demo``, which builds only the control plane) finds its binaries,
and a cold build of minutes happens outside every test's timeout. ``make
test`` and ``.ci/run`` have built them all already (``make toolchain``): for
them this is a no-op of milliseconds. Pure: paths in, part names out.
"""

from __future__ import annotations

from collections.abc import Iterable

# build.sh's part names (its usage lists the binaries of each).
CONTROL_PLANE = "control-plane"
TOOLS = "tools"
KUBE_ROUTER = "kube-router"
AUTOSCALER = "autoscaler"
KUEUE = "kueue"
REAL_NODES = "real-nodes"
PARTS = (CONTROL_PLANE, TOOLS, KUBE_ROUTER, AUTOSCALER, KUEUE, REAL_NODES)

# What tests under a path run beyond the control plane of the ``cluster`` fixture,
# by path prefix (a directory ends with "/"): helm for the chart and install tests,
# the enforcer, Kueue, cluster-autoscaler for the one scenario each that starts it.
BY_PATH: dict[str, tuple[str, ...]] = {
    "tests/unit/install/": (TOOLS,),
    "tests/integration/install/": (TOOLS,),
    "tests/realnode/": (CONTROL_PLANE, TOOLS, REAL_NODES),
    "tests/realnode/test_network_policy.py": (KUBE_ROUTER,),
    "tests/e2e/test_tenancy.py": (KUBE_ROUTER,),
    "tests/e2e/test_kueue.py": (KUEUE,),
    "tests/e2e/test_autoscaler.py": (AUTOSCALER,),
}


def parts_for(path: str, uses_cluster: bool) -> set[str]:
    """The parts one test needs: ``path`` relative to the repository (a node id's
    file part), ``uses_cluster`` when it asks for the ``cluster`` fixture."""
    out = {CONTROL_PLANE} if uses_cluster else set()
    for prefix, parts in BY_PATH.items():
        if path == prefix or (prefix.endswith("/") and path.startswith(prefix)):
            out.update(parts)
    return out


def build_args(tests: Iterable[tuple[str, bool]]) -> list[str]:
    """build.sh's arguments for a session's tests, in build.sh's order; [] for none
    (build.sh with no part would build every part but real-nodes)."""
    wanted: set[str] = set()
    for path, uses_cluster in tests:
        wanted |= parts_for(path, uses_cluster)
    return [p for p in PARTS if p in wanted]
