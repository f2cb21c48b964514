"""torchflex in-pod agent: rendezvous, worker launch, restarts. Never imports kopf."""
