"""Helpers for tests of every tier: a bounded wait that fails the test, a fresh namespace."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

from e2e.polling import poll_until

if TYPE_CHECKING:
    from e2e.cluster import Cluster


def wait_for(
    predicate: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.2
) -> float:
    """Poll ``predicate`` (bounded, ``e2e.polling``) until truthy; fail the test with ``what``.

    Returns the ``time.monotonic()`` at which it held.
    """
    got = poll_until(predicate, timeout_s, interval_s)
    if not got:
        pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what} (last: {got.value!r})")
    return got.at


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
