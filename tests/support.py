"""Small helpers for tests of every tier (bounded waits)."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from e2e.cluster import Cluster


def wait_for(
    predicate: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.2
) -> None:
    """Poll ``predicate`` (bounded) until truthy; fail the test with ``what``."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return
        time.sleep(interval_s)
    pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what} (last: {last!r})")


@contextlib.contextmanager
def fresh_namespace(cluster: Cluster, prefix: str) -> Iterator[str]:
    """A new namespace ``<prefix>-<8 hex>``, deleted afterwards (not waited for)."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    # Pods are refused until the ServiceAccount controller made "default".
    wait_for(
        lambda: cluster.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0,
        30,
        f"default ServiceAccount in {name}",
    )
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
