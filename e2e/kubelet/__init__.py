"""The process kubelet: runs pods bound to its nodes as real local processes.

Where it sits: started by ``e2e.cluster.lifecycle`` as ``python -m
e2e.kubelet``. ``podspec`` (pure: env, volumes, names), ``status`` (pure: pod
status documents), ``sandbox`` (network namespace + mount namespace +
process), ``agent`` (the watch/reconcile loop), ``fetch`` (its API reads:
watches, config maps, secrets, tokens, claims), ``runtime`` (one pod's state
on the node, its record and name files), ``nodes`` (node heartbeats) and
``records`` (what runs where, in ``<pod dir>/runtime.json``) make it up.
``faults`` freezes pods and cuts their links from those records, for the
e2e fault scenarios.
"""
