"""TorchX users submit, follow, read and cancel elastic jobs with ``torchx``.

Where it sits: e2e tier. The ``torchx`` command line (the ``torchflex`` scheduler
of ``submit/torchflex_torchx``, found through its entry point) against the local
control plane and the real operator, no mocked API: ``torchx run -s torchflex
dist.ddp -j 2:3x1`` makes an ElasticJob of 2..3 pods whose workers train to the
end; ``torchx status`` follows it to ``SUCCEEDED``; ``torchx log`` reads a
worker's steps; a second job is cancelled while it runs (its pods go, its status
says ``CANCELLED``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import Cluster
from e2e.operator_proc import OperatorProcess
from e2e.workload import PROCESS_NODE, get_job, worker_pods
from tests.support import wait_for

pytestmark = pytest.mark.timeout(420)

TORCHX = str(Path(sys.executable).parent / "torchx")


def _torchx(cluster: Cluster, *args: str) -> str:
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    out = subprocess.run(
        [TORCHX, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, f"torchx {' '.join(args)}: {out.stderr[-3000:]}"
    return out.stdout


def _submit(cluster: Cluster, namespace: str, ckpt: Path, steps: int) -> str:
    out = _torchx(
        cluster,
        "run",
        "-s",
        "torchflex",
        "-cfg",
        f'namespace={namespace},node_selector="kubernetes.io/hostname={PROCESS_NODE}"',
        "dist.ddp",
        "-j",
        "2:3x1",
        "--cpu",
        "1",
        "--memMB",
        "512",
        "--max_retries",
        "3",
        "--mounts",
        f"type=bind,src={ckpt},dst=/ckpt",
        "--script",
        "examples/train_elastic.py",
        "--",
        "--steps",
        str(steps),
        "--step-time",
        "0.1",
        "--ckpt-dir",
        "/ckpt",
    )
    handle = out.strip().splitlines()[-1]
    assert handle.startswith(f"torchflex://torchx/{namespace}:"), out
    return handle


def _status(cluster: Cluster, handle: str) -> dict[str, Any]:
    status: dict[str, Any] = json.loads(_torchx(cluster, "status", "--json", handle))
    return status


def test_torchx_runs_follows_logs_and_cancels_an_elastic_job(
    cluster: Cluster, namespace: str, operator_proc: OperatorProcess, ckpt_dir: Path
) -> None:
    handle = _submit(cluster, namespace, ckpt_dir / "a", steps=40)
    name = handle.rsplit(":", 1)[1]
    spec = get_job(cluster, namespace, name)["spec"]
    assert (spec["minReplicas"], spec["maxReplicas"], spec["nprocPerNode"]) == (2, 3, 1)

    seen: list[str] = []

    def finished() -> bool:
        seen.append(_status(cluster, handle)["state"])
        return seen[-1] in ("SUCCEEDED", "FAILED", "CANCELLED")

    wait_for(finished, 300, f"{handle} to finish (states seen: {seen})", interval_s=2)
    assert seen[-1] == "SUCCEEDED", seen

    log = _torchx(cluster, "log", f"{handle}/train_elastic/0")
    assert re.search(r"step=\d+ loss=", log), log[-2000:]

    # The second job: cancelled while it trains.
    second = _submit(cluster, namespace, ckpt_dir / "b", steps=100000)
    second_name = second.rsplit(":", 1)[1]
    wait_for(lambda: _status(cluster, second)["state"] == "RUNNING", 240, f"{second} running")
    _torchx(cluster, "cancel", second)
    wait_for(lambda: _status(cluster, second)["state"] == "CANCELLED", 60, f"{second} cancelled")
    wait_for(lambda: not worker_pods(cluster, namespace, second_name), 120, f"{second}'s pods gone")
