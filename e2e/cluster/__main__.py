"""``python -m e2e.cluster up|down|status``: what `make cluster` runs."""

from __future__ import annotations

import argparse
import sys
import time

from e2e.cluster.handle import Cluster
from e2e.cluster.layout import Layout, state_dir
from e2e.cluster.lifecycle import ensure_up, shell_exports, tear_down


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.cluster")
    parser.add_argument("action", choices=["up", "down", "status"])
    args = parser.parse_args(argv)
    if args.action == "up":
        t0 = time.monotonic()
        cluster = ensure_up()
        print(f"# local control plane ready in {time.monotonic() - t0:.1f}s", file=sys.stderr)
        print(f"# nodes: {', '.join(cluster.process_nodes)} (process kubelet)", file=sys.stderr)
        print("# to use it, run:", file=sys.stderr)
        print(shell_exports(cluster), end="")
        return 0
    if args.action == "down":
        tear_down()
        print("local control plane stopped and removed", file=sys.stderr)
        return 0
    lay = Layout(state_dir())
    if not lay.info.exists():
        print("no local cluster", file=sys.stderr)
        return 1
    cluster = Cluster.load(lay)
    print("ready" if cluster.ready() else "not ready")
    return 0 if cluster.ready() else 1


if __name__ == "__main__":
    sys.exit(main())
