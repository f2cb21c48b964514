"""Pure manifests of a job: pods, backends' hosts, NetworkPolicy, PodGroup, budget, Workload.
May import: ``model`` and ``torchflex_contract`` (no I/O, no clock, no logging)."""
