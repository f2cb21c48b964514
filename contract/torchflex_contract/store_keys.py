"""The key layout every rendezvous backend shares.

Where it sits: the agent's rendezvous code builds every key through
``Keys``; tests and the store pod use it to inspect state. All keys of a job
live under one prefix derived from its rendezvous id, so two jobs never
collide on a shared store or etcd.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Final

ROOT: Final = "/torchflex/v1"
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def sanitize_run_id(run_id: str) -> str:
    """A run id usable as a key segment; rejects empty and the torchrun default."""
    if not run_id or run_id == "none":
        raise ValueError("rendezvous id must be set and not 'none' (jobs would share state)")
    return _SAFE.sub("_", run_id)


@dataclasses.dataclass(frozen=True)
class Keys:
    run_id: str

    @property
    def prefix(self) -> str:
        return f"{ROOT}/{sanitize_run_id(self.run_id)}"

    def key(self, *parts: object) -> str:
        return "/".join([self.prefix, *(str(p) for p in parts)])
