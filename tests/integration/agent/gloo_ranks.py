"""Real gloo ranks as subprocesses, each with its own state folder: the state API without agents.

Where it sits: imported by the state API's rank-level tests in this folder
(``test_state_api_without_numpy.py``, ``test_state_peer_ranks.py``). Each rank
runs a ``python -c`` script with the env a ``torchflex-agent`` worker gets for
the state API (``RANK``, ``TORCHFLEX_STATE_DIR``, the lease file, the round)
and prints one JSON line last, which :func:`run_ranks` returns. Network:
127.0.0.1 only; every process is started here and killed by PID.

A rank ends as ``torchflex-agent`` ends a worker (``zygote``): ``os._exit``
once the script returns, never in interpreter finalization. There, with
torch 2.13, a gloo group that ``destroy_process_group`` did not free (an
optimizer in the process keeps it referenced) is freed while its runloop
thread may still be dropping the last work's tensors; that thread cannot
take the GIL any more and the process aborts ("terminate called without an
active exception": 4 of 20 two-rank runs on this machine, CI of stop 33).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from e2e.localproc import free_port
from torchflex_contract import env as tfenv

_END_AS_A_WORKER = """
import os as _os, sys as _sys
_sys.stdout.flush()
_sys.stderr.flush()
_os._exit(0)
"""


def rank_envs(folders: Sequence[Path], lease: Path, round_no: int) -> list[dict[str, str]]:
    """One worker env per folder (rank = its index), sharing one master port."""
    port = free_port()
    return [
        {
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": ":".join(sys.path),
            "RANK": str(rank),
            "LOCAL_RANK": "0",
            "WORLD_SIZE": str(len(folders)),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            tfenv.STATE_DIR: str(folder),
            tfenv.FENCE_FILE: str(lease),
            tfenv.ROUND: str(round_no),
        }
        for rank, folder in enumerate(folders)
    ]


def run_ranks(
    script: str, envs: Sequence[dict[str, str]], args: Sequence[str] = (), timeout: float = 120
) -> list[dict[str, Any]]:
    """Run ``script`` once per env, all at once; each one's last stdout line, as JSON."""
    cmd, pipe = [sys.executable, "-c", script + _END_AS_A_WORKER, *args], subprocess.PIPE
    procs = [subprocess.Popen(cmd, env=env, stdout=pipe, stderr=pipe, text=True) for env in envs]
    results = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=timeout)
        finally:
            p.kill()
        assert p.returncode == 0, (out[-2000:], err[-3000:])
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results
