"""The shipped examples, applied unchanged, survive a ``kubectl scale``.

Where it sits: e2e tier. Each ``examples/elasticjob-*.yaml`` goes through
``kubectl apply -n <test namespace>`` byte for byte (its objects name no
namespace): its ``workingDir: /workspace`` and command are the agent image's,
its checkpoints go to the PersistentVolumeClaim it declares (bound by the
local cluster's default StorageClass); the etcd one runs a managed etcd pod.
After a scale the re-formed group must resume from a checkpoint, not start
again from step 1.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from e2e.cluster import Cluster
from e2e.operator_proc import OperatorProcess
from e2e.trainlog import LogFollower
from tests.e2e.checks import current_round, wait_training
from tests.support import wait_for

pytestmark = pytest.mark.timeout(420)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _job_name(example: Path) -> str:
    docs = [d for d in yaml.safe_load_all(example.read_text()) if d]
    (job,) = [d for d in docs if d["kind"] == "ElasticJob"]
    return str(job["metadata"]["name"])


# Every example, so a new one is held to the same promise.
@pytest.mark.parametrize("manifest", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_example_applies_unchanged_and_resumes_after_scale(
    cluster: Cluster,
    namespace: str,
    operator_proc: OperatorProcess,
    follower: LogFollower,
    manifest: str,
) -> None:
    example = EXAMPLES / manifest
    job = _job_name(example)
    cluster.kubectl("apply", "-n", namespace, "-f", str(example))
    try:
        # Three workers (c10d: no spec.replicas means maxReplicas), then the
        # headers' scale to two.
        t_full = wait_training(follower, 0, 240, world=3)
        wait_for(
            lambda: any(c.step > 0 and c.seen > t_full for c in follower.lines("checkpoint")),
            120,
            "a checkpoint of the full group",
        )
        saved = max(c.step for c in follower.lines("checkpoint"))
        before = current_round(follower)
        t_scale = time.monotonic()
        cluster.kubectl("scale", f"ej/{job}", "-n", namespace, "--replicas=2")
        wait_training(follower, saved, 180, world=2, after=t_scale)

        resumed = [r for r in follower.lines("resumed") if r.round > before]
        assert resumed, "the re-formed group did not resume from a checkpoint"
        assert min(r.step for r in resumed) >= saved
        first = min(s.step for s in follower.lines("step") if s.world == 2 and s.seen > t_scale)
        assert first > saved, f"the re-formed group started at step {first}, not after {saved}"
        claim = cluster.get_json("pvc", f"{job}-ckpt", "-n", namespace)
        assert claim["status"]["phase"] == "Bound"
    finally:
        cluster.kubectl("delete", "-n", namespace, "-f", str(example), "--wait=false", check=False)
