"""A cluster does not start in a slot another cluster already runs in.

Where it sits: ``e2e.cluster.lifecycle.ensure_up`` checks, before spawning
anything, that no process kubelet of another state directory answers on the
slot's first node address (a clone's CI started beside a benchmark's cluster
left up once ran half-connected to it: its ``kubectl logs`` reached the other
cluster's kubelet). Real sockets on 127.0.0.1, opened and closed here.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from e2e.cluster.controlplane import ClusterStartError
from e2e.cluster.lifecycle import refuse_a_taken_slot
from e2e.localproc import listening


def test_a_listener_makes_the_slot_taken_and_the_error_says_what_to_do(tmp_path: Path) -> None:
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        assert listening("127.0.0.1", port)
        with pytest.raises(ClusterStartError) as err:
            refuse_a_taken_slot(tmp_path, "127.0.0.1", port)
    message = str(err.value)
    assert f"127.0.0.1:{port}" in message and str(tmp_path) in message
    assert "TORCHFLEX_CLUSTER_SLOT" in message and "cluster-down" in message


def test_a_free_slot_passes(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, never listening: connections are refused
        assert not listening("127.0.0.1", port)
        refuse_a_taken_slot(tmp_path, "127.0.0.1", port)
