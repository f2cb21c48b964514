"""The shipped example, applied unchanged, survives a ``kubectl scale``.

Where it sits: e2e tier. ``examples/elasticjob-c10d.yaml`` goes through
``kubectl apply -n <test namespace>`` byte for byte (its objects name no
namespace): its ``workingDir: /workspace`` and command are the agent image's,
its checkpoints go to the PersistentVolumeClaim it declares (bound by the
local cluster's default StorageClass). After a scale the re-formed group must
resume from a checkpoint, not start again from step 1.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from e2e.cluster import Cluster
from e2e.operator_proc import OperatorProcess
from e2e.trainlog import LogFollower
from tests.e2e.checks import current_round, wait_training
from tests.support import wait_for

pytestmark = pytest.mark.timeout(420)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "elasticjob-c10d.yaml"
JOB = "mnist-c10d"


def test_c10d_example_applies_unchanged_and_resumes_after_scale(
    cluster: Cluster, namespace: str, operator_proc: OperatorProcess, follower: LogFollower
) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", str(EXAMPLE))
    try:
        # No spec.replicas: maxReplicas (3) workers; the header's scale is to 2.
        t_full = wait_training(follower, 0, 240, world=3)
        wait_for(
            lambda: any(c.step > 0 and c.seen > t_full for c in follower.lines("checkpoint")),
            120,
            "a checkpoint of the full group",
        )
        saved = max(c.step for c in follower.lines("checkpoint"))
        before = current_round(follower)
        t_scale = time.monotonic()
        cluster.kubectl("scale", f"ej/{JOB}", "-n", namespace, "--replicas=2")
        wait_training(follower, saved, 180, world=2, after=t_scale)

        resumed = [r for r in follower.lines("resumed") if r.round > before]
        assert resumed, "the re-formed group did not resume from a checkpoint"
        assert min(r.step for r in resumed) >= saved
        first = min(s.step for s in follower.lines("step") if s.world == 2 and s.seen > t_scale)
        assert first > saved, f"the re-formed group started at step {first}, not after {saved}"
        claim = cluster.get_json("pvc", f"{JOB}-ckpt", "-n", namespace)
        assert claim["status"]["phase"] == "Bound"
    finally:
        cluster.kubectl("delete", "-n", namespace, "-f", str(EXAMPLE), "--wait=false", check=False)
