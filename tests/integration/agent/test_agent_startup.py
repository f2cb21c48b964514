"""A new agent starts its worker fork server before anything else it does.

Where it sits: integration test of ``cli`` (issue 18, the scale-up join). The
fork server's imports (torch: 1.5-3 s) are the longest part of a new node's
start, so the agent starts it before its own imports and before counting
GPUs, which imports torch when no GPU limit is given (``--nproc-per-node
auto``, the ElasticJob's default, on a CPU pod). A real ``torchflex-agent``
runs here with ``auto`` and no GPU limit; a stand-in ``torch`` on its path
(the script itself never imports torch) waits, bounded, until the fork server
has preloaded the script's imports and writes down whether it had: the order
is read from files, not from a clock.
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

from tests.integration.agent.tfagent_helpers import AGENT_BIN, PYTHON, child_env

# The stand-in torch: the agent's GPU count waits for the fork server's preload.
STAND_IN_TORCH = textwrap.dedent(
    """
    import os, pathlib, time
    _probe = pathlib.Path(os.environ["PROBE_DIR"])
    _deadline = time.monotonic() + 10
    while not (_probe / "preloaded").exists() and time.monotonic() < _deadline:
        time.sleep(0.02)
    (_probe / "gpus-counted").write_text(
        "after the preload" if (_probe / "preloaded").exists() else "before the preload"
    )

    class cuda:
        @staticmethod
        def device_count():
            return 0
    """
)
# Imported by the script at its top level, so by the fork server's preload.
PROBE = textwrap.dedent(
    """
    import os, pathlib
    pathlib.Path(os.environ["PROBE_DIR"], "preloaded").touch()
    """
)
SCRIPT = "import probe\nprint('worker ran', flush=True)\n"


def test_fork_server_starts_before_the_gpu_count(tmp_path: Path) -> None:
    site, probe_dir, job = tmp_path / "site", tmp_path / "probe", tmp_path / "job"
    for d in (site / "torch", probe_dir, job):
        d.mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text(STAND_IN_TORCH)
    (site / "probe.py").write_text(PROBE)
    (job / "train.py").write_text(SCRIPT)
    cmd = [
        AGENT_BIN,
        "--rdzv-backend=memory",
        "--rdzv-endpoint=localhost:1",
        "--rdzv-id=startup",
        "--nnodes=1",
        "--nproc-per-node=auto",
        "--",
        PYTHON,
        str(job / "train.py"),
    ]
    env = child_env({"PYTHONPATH": str(site), "PROBE_DIR": str(probe_dir)})
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "worker ran" in output, output
    assert "worker fork server ready" in output, output
    assert (probe_dir / "gpus-counted").read_text() == "after the preload", output
