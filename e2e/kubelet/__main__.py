"""``python -m e2e.kubelet --state-dir D --node N [--node M ...]``.

A node the autoscaler test cloud starts (e2e/autoscaler) runs in a process of
its own: ``--first-host`` and ``--first-pod-ip`` keep its node address and its
pods' addresses apart from every other kubelet process's, ``--label`` and
``--provider-id`` are what the cloud's node group knows it by.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kubernetes import config

from e2e.kubelet.agent import Kubelet
from e2e.kubelet.nodes import Placement


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.kubelet")
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--node", action="append", required=True)
    parser.add_argument("--first-host", type=int, default=1, help="host number of the first node")
    parser.add_argument("--first-pod-ip", type=int, default=2, help="first pod address index")
    parser.add_argument("--label", action="append", default=[], help="KEY=VALUE on every node")
    parser.add_argument("--provider-id", default="", help="spec.providerID (one node only)")
    args = parser.parse_args(argv)
    info = json.loads((args.state_dir / "cluster.json").read_text())
    api = config.new_client_from_config(str(args.state_dir / "kubelet.kubeconfig"))
    labels = dict(item.split("=", 1) for item in args.label)
    Kubelet(
        api,
        args.node,
        args.state_dir,
        int(info["ports"]["apiserver"]),
        placement=Placement(args.first_host, args.first_pod_ip, labels, args.provider_id),
    ).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
