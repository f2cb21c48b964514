"""What the Helm chart needs to run the operator on this cluster's real node (issue 16).

Where it sits: beside ``e2e.realnode.imagebuild``; pure (reads the cluster's
recorded ports). Used by ``tests/realnode`` and ``make demo NODES=real``
wherever they ``helm install`` the chart, on top of the values a test or the
demo chooses. Two facts of the local cluster, not of the chart:

- the operator pod goes to the real node (``nodeSelector``), not to the
  process kubelet's node, which would ignore the image;
- it reaches the API server on the harness bridge: there is no kube-proxy,
  so nothing answers at the ``kubernetes`` Service's ClusterIP that
  in-cluster config dials; the API server's certificate names the bridge
  address, and container env wins over the kubelet's Service variables
  (docs/real-nodes.md).
"""

from __future__ import annotations

from typing import Any

from e2e.cluster.handle import Cluster
from e2e.cluster.layout import GATEWAY_IP
from e2e.realnode.plan import NODE_LABEL


def cluster_values(cluster: Cluster) -> dict[str, Any]:
    """Values for the chart that only this cluster needs (merge ``operator`` keys)."""
    return {
        "nodeSelector": {NODE_LABEL: "true"},
        "operator": {
            "extraEnv": [
                {"name": "KUBERNETES_SERVICE_HOST", "value": GATEWAY_IP},
                {
                    "name": "KUBERNETES_SERVICE_PORT",
                    "value": str(cluster.info["ports"]["apiserver"]),
                },
            ]
        },
    }
