"""The local real control plane: etcd, kube-apiserver, controller-manager,
scheduler, the kwok controller and our process kubelet, all on loopback plus
one bridge of our own.

Where it sits: `make cluster` / `make cluster-down` (``python -m
e2e.cluster``) and the pytest ``cluster`` fixture use :func:`ensure_up` and
:class:`Cluster`; the binaries come from ``e2e/toolchain/build.sh``.
"""

from e2e.cluster.handle import Cluster
from e2e.cluster.lifecycle import ensure_up, restart_scheduler, tear_down

__all__ = ["Cluster", "ensure_up", "restart_scheduler", "tear_down"]
