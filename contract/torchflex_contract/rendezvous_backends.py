"""The names of the rendezvous backends: one spelling for the CRD, the operator and the agent.

Where it sits: ``spec.rendezvous.backend`` (the CRD's enum, checked against
``SPEC_BACKENDS`` by tests/unit/install/test_crd_rendezvous_backends.py) is
parsed into a ``RendezvousBackend`` by the operator's ``spec``; the operator's
``backends`` module holds one descriptor per spec backend (its pods,
Services and endpoint), the agent's ``backends`` module one per name (its
store connection) and its ``endpoints`` module the endpoint syntax of each
(pure, for flag parsing). The name travels in
``env.RDZV_BACKEND``. Adding a backend starts here.
"""

from __future__ import annotations

import enum
from typing import Final


class RendezvousBackend(enum.StrEnum):
    """Where the agents of one job keep their shared rendezvous state."""

    C10D = "c10d"
    """A torch TCPStore: the operator runs it as the job's ``<name>-store`` pod."""
    ETCD = "etcd"
    """An etcd v3 server: the user's endpoint, or a per-job ``<name>-etcd`` pod."""
    MEMORY = "memory"
    """An in-process store of one agent: tests only, never in a job spec."""


SPEC_BACKENDS: Final = (RendezvousBackend.C10D, RendezvousBackend.ETCD)
"""What ``spec.rendezvous.backend`` accepts, in the CRD enum's order."""

DEFAULT_BACKEND: Final = RendezvousBackend.C10D
"""The CRD's default and the agent's ``--rdzv-backend`` default."""
