"""The opt-in node check an agent runs before its first join.

Where it sits: ``loop.agent.ElasticAgent`` calls ``check_node`` once at start-up
when ``--node-check on`` (``spec.nodeCheck.enabled``). It runs a short program
in the training command's interpreter (the agent never imports torch): a
timed 512x512 matmul on each device the workers would use (each GPU, else the
CPU), each device's result compared with the CPU's, and prints the figures.
``loop.logic.preflight.verdict`` compares the node's slowest device with the
agents that passed before it (``Rendezvous.node_checks``); a node that fails
raises ``AgentExitError(BAD_NODE)`` with its figures, so it never joins and
the operator replaces its pod elsewhere (``status.avoidedNodes``). A node that
passes publishes its figure for those that come after.

Not checked: the network. A collective with a peer would need a peer that is
not in a round yet; a bad link shows as a straggler once training
(docs/agent.md).
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from collections.abc import Sequence

from torchflex_agent.loop.logic import preflight
from torchflex_agent.loop.supervise import AgentExitError
from torchflex_agent.rendezvous.protocol import Rendezvous
from torchflex_agent.workers.prewarm import python_launch
from torchflex_contract.exit_codes import ExitCode

log = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 120.0
_PROGRAM = """
import json, time, torch
devices = [f"cuda:{i}" for i in range(torch.cuda.device_count())] or ["cpu"]
out = []
for name in devices:
    dev = torch.device(name)
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    x, y = a.to(dev), b.to(dev)
    correct = torch.allclose((x @ y).cpu(), a @ b, rtol=1e-3, atol=1e-2)
    for _ in range(3):
        x @ y
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 0.5:
        x @ y
        n += 1
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    took = time.perf_counter() - t0
    out.append({"device": name, "gflops": 2 * 512**3 * n / took / 1e9, "correct": bool(correct)})
print(json.dumps(out))
"""


def check_interpreter(command: Sequence[str]) -> str:
    """The training command's Python (``python train.py``), else the agent's own."""
    launch = python_launch(command)
    found = shutil.which(launch.interpreter) if launch is not None else None
    return found or sys.executable


def check_node(rdzv: Rendezvous, python: str) -> preflight.Verdict:
    """Run the check with ``python``; publish a pass, raise ``AgentExitError`` on a fail."""
    try:
        done = subprocess.run(
            [python, "-c", _PROGRAM],
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0:
            raise ValueError(f"exit code {done.returncode}: {done.stderr.strip()[-300:]}")
        figures = preflight.parse_figures(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        text = f"node check failed to run: {exc}"
        raise AgentExitError(ExitCode.BAD_NODE, text) from exc
    got = preflight.verdict(figures, rdzv.node_checks())
    if not got.ok:
        text = f"node check failed: {got.reason}"
        log.error("%s", text)
        raise AgentExitError(ExitCode.BAD_NODE, text)
    log.info("node check passed: %s", got.reason)
    rdzv.publish_node_check(got.gflops)
    return got
