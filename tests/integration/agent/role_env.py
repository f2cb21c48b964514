"""A worker of the roles tests: prints its role environment as one JSON line, then idles.

Usage: ``python role_env.py SECONDS``. Stdlib only (no torch): what is checked is the
environment ``torchflex-agent`` gives it, not a process group.
"""

from __future__ import annotations

import json
import os
import sys
import time

KEYS = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
    "TORCHFLEX_ROUND", "TORCHFLEX_SERVICE_PORT", "TORCHFLEX_ROLES_FILE", "TORCHFLEX_ROLE_RANKS",
)  # fmt: skip

print("ENV " + json.dumps({**{k: os.environ.get(k) for k in KEYS}, "pid": os.getpid()}), flush=True)
time.sleep(float(sys.argv[1]))
