"""A ``kubectl scale`` reaches the job's ``worldSize`` through the held long poll.

Real agents (``torchflex-agent`` wrapping a sleeping worker) run in pods on
the process node; the operator polls their ``/status`` and holds one
``GET /status?after=<round>`` on the rank-0 agent. After the scale the new
member joins, the group re-forms, that request answers and the job is
re-planned: ``poller.wakes`` counts it, so the new world size is shown to
come from the long poll, not from the next regular poll.
"""

from __future__ import annotations

import dataclasses
import time

import pytest

from e2e.cluster import Cluster
from tests.integration.operator.conftest import TEST_SETTINGS, run_operator
from tests.integration.operator.jobs import SLEEP, apply, get_job, process_job
from tests.support import wait_for
from torchflex_operator.runtime.agent_status import StatusPoller

pytestmark = pytest.mark.cluster


@pytest.mark.timeout(600)
def test_scale_reaches_world_size_through_the_long_poll(
    cluster: Cluster, namespace: str, crd: None, kubeconfig_env: None
) -> None:
    name = "watched"
    key = (namespace, name)
    # A regular poll far slower than the long poll would answer.
    poller = StatusPoller(enabled=True, timeout=1.0, interval=30.0)
    # This tier's pods run their command bare ("env"); here the real agent wraps it.
    settings = dataclasses.replace(TEST_SETTINGS, agent_command="torchflex-agent")
    with run_operator(cluster, namespace, settings=settings, poller=poller):
        job = process_job(
            name,
            cluster.process_node,
            SLEEP,
            minReplicas=1,
            maxReplicas=2,
            replicas=1,
            rendezvous={"backend": "c10d"},  # the operator's store pod: real rendezvous
        )
        apply(cluster, namespace, job)

        def world(size: int) -> bool:
            status = get_job(cluster, namespace, name).get("status") or {}
            return status.get("worldSize") == size

        wait_for(lambda: world(1), 300, "worldSize 1 in the job status")
        wait_for(lambda: poller.watching(key), 120, "a long poll held on the rank-0 agent")
        wakes = poller.wakes
        scaled = time.monotonic()
        cluster.kubectl("scale", "-n", namespace, f"ej/{name}", "--replicas=2")
        wait_for(lambda: world(2), 300, "worldSize 2 in the job status")
        took = time.monotonic() - scaled
        assert poller.wakes > wakes  # the held request answered and woke the job
    print(f"kubectl scale -> worldSize 2 in status: {took:.1f} s")  # measured, not asserted
