"""cluster-autoscaler against a test cloud of process-kubelet nodes (issue 17).

``groups`` is the cloud's bookkeeping (pure), ``cloud`` the cloud itself (its
HTTP hook, the gRPC bridge process, node processes, spot reclaims) and
``autoscaler`` runs cluster-autoscaler against it.
"""
