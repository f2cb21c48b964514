"""The I/O: worker loop, reconcile, apply, per-job memory, caches, agents, leader, handlers.
May import: everything below it (``kube``, ``planning``, ``render``, ``model``); not ``cli``."""
