"""The opt-in node check an agent runs before its first join.

Where it sits: ``loop.agent.ElasticAgent`` calls ``check_node`` once at start-up
when ``--node-check on`` (``spec.nodeCheck.enabled``). It runs short programs
in the training command's interpreter (the agent never imports torch).
Compute: a timed 512x512 matmul on each device the workers would use (each
GPU, else the CPU), each device's result compared with the CPU's;
``loop.logic.preflight.verdict`` compares the node's slowest device with the
agents that passed before it. Network: a node that passed that waits
``PEER_WAIT_S`` (up to ``PEER_MAX_WAIT_S`` while other nodes are still in their
check) for another node checking at the same time (a job's pods start
together) in the store's lobby (``rendezvous.node_check``); paired, the two run
a timed gloo all_reduce of 4 MiB over TCP between their addresses (the one that
waited hosts the pair's TCPStore on the port it announced), and
``loop.logic.preflight.link_verdict`` checks the sum and compares the bus
bandwidth with the agents that passed with a peer before. A node that fails
either half raises ``AgentExitError(BAD_NODE)`` with its figures (and its
peer's name), so it never joins and the operator replaces its pod elsewhere
(``status.avoidedNodes``). A node that passes publishes its figures for those
that come after.

Not checked: a node with no peer checking at the same time (a replacement
joining a running job) checks no network; nor do GPU links (NVLink,
InfiniBand, NCCL): the collective is gloo over the pod network. A pair whose
collective fails both fail: two nodes cannot tell which end is at fault.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from collections.abc import Sequence
from typing import NoReturn

from torchflex_agent.loop.logic import preflight
from torchflex_agent.loop.node import free_port
from torchflex_agent.loop.supervise import AgentExitError
from torchflex_agent.rendezvous.node_check import NodeCheckRecords, Pairing
from torchflex_agent.rendezvous.protocol import Rendezvous
from torchflex_agent.workers.prewarm import python_launch
from torchflex_contract.exit_codes import ExitCode

log = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 120.0
PEER_WAIT_S = 5.0
"""How long a node that passed its compute half waits for a peer checking at the same time..."""
PEER_MAX_WAIT_S = 30.0
"""... and at most, while other nodes are still in their check."""
LINK_TIMEOUT_S = 20.0
"""The collective program's limit on connecting to its peer and on each all_reduce.

A connect that cannot reach the peer gives up after about twice this (c10d's
TCPStore retries once), so the program as a whole gets four times it."""
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


_LINK_PROGRAM = """
import datetime, json, os, sys, time
out = {"gbps": 0.0, "correct": False, "error": ""}
try:
    import torch, torch.distributed as dist
    rank, host, port, me = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    limit = datetime.timedelta(seconds=float(sys.argv[5]))
    store = dist.TCPStore(host, port, 2, is_master=rank == 0, timeout=limit)
    gloo = dist.ProcessGroupGloo
    options = gloo._Options()
    options._devices = [gloo.create_device(hostname=me)]
    options._timeout = limit
    group = gloo(store, rank, 2, options)
    n, iters = 1 << 20, 16
    base = torch.arange(n, dtype=torch.float32) % 1000
    x = base * (rank + 1)
    group.allreduce([x]).wait()
    out["correct"] = bool(torch.equal(x, base * 3))
    group.allreduce([x]).wait()
    t0 = time.perf_counter()
    for _ in range(iters):
        group.allreduce([x]).wait()
    out["gbps"] = 4 * n * iters / (time.perf_counter() - t0) / 1e9
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300].rstrip(".")
try:
    # The store's host (rank 0) outlives the peer's last all_reduce.
    store.set(f"done/{rank}", "1")
    if rank == 0:
        store.wait(["done/1"])
except Exception:
    pass
print(json.dumps(out), flush=True)
# No destructors: a gloo group or store torn down at exit can abort the process
# ("terminate called without an active exception"), after the figure is printed.
os._exit(0)
"""


def _last_line(python: str, program: str, args: Sequence[str], timeout: float) -> str:
    """Run ``program`` with ``python``; its last line of output.

    ValueError on a non-zero exit or a timeout (its text without the program's).
    """
    try:
        done = subprocess.run(
            [python, "-c", program, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise ValueError(f"timed out after {timeout:g} s") from exc
    if done.returncode != 0:
        raise ValueError(f"exit code {done.returncode}: {done.stderr.strip()[-300:]}")
    return done.stdout.strip().splitlines()[-1]


def check_interpreter(command: Sequence[str]) -> str:
    """The training command's Python (``python train.py``), else the agent's own."""
    launch = python_launch(command)
    found = shutil.which(launch.interpreter) if launch is not None else None
    return found or sys.executable


def check_node(rdzv: Rendezvous, python: str) -> preflight.Verdict:
    """Run the check with ``python``; publish a pass, raise ``AgentExitError`` on a fail."""
    records = rdzv.node_check_records()
    records.begin()
    try:
        got, linked = _check(records, python, rdzv.node.addr)
    finally:
        records.end()
    log.info("node check passed: %s; %s", got.reason, linked.reason)
    records.publish(got.gflops, linked.gbps)
    return got


def _check(
    records: NodeCheckRecords, python: str, addr: str
) -> tuple[preflight.Verdict, preflight.LinkVerdict]:
    """Both halves' verdicts, passed; ``AgentExitError`` on a fail."""
    try:
        figures = preflight.parse_figures(_last_line(python, _PROGRAM, [], CHECK_TIMEOUT_S))
    except (OSError, ValueError, IndexError) as exc:
        text = f"node check failed to run: {exc}"
        raise AgentExitError(ExitCode.BAD_NODE, text) from exc
    peers = records.figures()
    got = preflight.verdict(figures, peers.gflops)
    if not got.ok:
        _fail(got.reason)
    pairing = records.pair(free_port(), PEER_WAIT_S, PEER_MAX_WAIT_S)
    if pairing is not None:
        log.info("node check: all_reduce with %s (rank %d)", pairing.peer, pairing.rank)
    link = None if pairing is None else _collective(python, pairing, addr)
    linked = preflight.link_verdict(link, pairing.peer if pairing else "", peers.gbps)
    if not linked.ok:
        _fail(f"{linked.reason}; compute {got.reason}")
    return got, linked


def _fail(reason: str) -> NoReturn:
    text = f"node check failed: {reason}"
    log.error("%s", text)
    raise AgentExitError(ExitCode.BAD_NODE, text)


def _collective(python: str, pairing: Pairing, addr: str) -> preflight.LinkFigure:
    """The pair's timed all_reduce, this node's side; a failure to run is a failed figure."""
    args = [str(pairing.rank), pairing.host_addr, str(pairing.port), addr, str(LINK_TIMEOUT_S)]
    try:
        return preflight.parse_link(_last_line(python, _LINK_PROGRAM, args, 4 * LINK_TIMEOUT_S))
    except (OSError, ValueError, IndexError, KeyError) as exc:
        return preflight.LinkFigure(0.0, False, f"did not run: {exc}")
