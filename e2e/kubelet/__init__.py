"""The process kubelet: runs pods bound to its nodes as real local processes.

Where it sits: started by ``e2e.cluster.lifecycle`` as ``python -m
e2e.kubelet``. ``podspec`` (pure: env, volumes, names), ``status`` (pure: pod
status documents), ``sandbox`` (network namespace + mount namespace +
process), ``agent`` (the watch/reconcile loop and node heartbeats) and
``logserver`` (``kubectl logs``) make it up.
"""
