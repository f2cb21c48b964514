"""The real-node flavor of the local cluster (issue 16): a kubelet built from
the pinned Kubernetes, Debian's containerd and runc, and the CNI bridge
plugin on the harness's own bridge, joined to a running ``e2e.cluster``.

Rooms: ``plan`` (pure: names, addresses, paths and every config file's
text), ``images`` (OCI image tarballs built here: pause, busybox),
``node`` (acts: certificates, daemons, image import, tear-down),
``__main__`` (``python -m e2e.realnode up|down``). Beside the process
kubelet, never instead of it: ``tests/realnode`` (in ``make test``),
``make demo NODES=real`` (``e2e.demo_real``) and ``python -m e2e.realnode``
start it;
``e2e.cluster``'s tear-down removes it (a no-op when none runs).
"""

from e2e.realnode.node import RealNode, real_node_down, real_node_up

__all__ = ["RealNode", "real_node_down", "real_node_up"]
