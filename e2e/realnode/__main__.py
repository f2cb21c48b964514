"""``python -m e2e.realnode up|down``: the real node of this slot's cluster.

``up`` starts the slot's control plane if needed (as ``make cluster``),
then the real node; ``down`` removes only the real node (``make
cluster-down`` afterwards stops the control plane).
"""

from __future__ import annotations

import argparse
import sys
import time

from e2e.cluster import ensure_up
from e2e.cluster.handle import Cluster
from e2e.cluster.layout import Layout, state_dir
from e2e.realnode.node import real_node_down, real_node_up


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.realnode")
    parser.add_argument("action", choices=["up", "down"])
    args = parser.parse_args(argv)
    if args.action == "up":
        cluster = ensure_up()
        t0 = time.monotonic()
        node = real_node_up(cluster)
        print(f"# real node {node.name} Ready in {time.monotonic() - t0:.1f}s", file=sys.stderr)
        return 0
    lay = Layout(state_dir())
    real_node_down(lay.root, Cluster.load(lay) if lay.info.exists() else None)
    print("real node stopped and removed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
