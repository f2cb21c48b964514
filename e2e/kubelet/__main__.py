"""``python -m e2e.kubelet --state-dir D --node N [--node M ...]``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kubernetes import config

from e2e.kubelet.agent import Kubelet


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.kubelet")
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--node", action="append", required=True)
    args = parser.parse_args(argv)
    info = json.loads((args.state_dir / "cluster.json").read_text())
    api = config.new_client_from_config(str(args.state_dir / "kubelet.kubeconfig"))
    Kubelet(api, args.node, args.state_dir, int(info["ports"]["apiserver"])).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
