"""A training script that reports its step and checkpoints with the helper (no torch).

``report_progress.py STEPS CKPT_DIR RELEASE``: ``STEPS`` steps of 50 ms,
each reported with ``report_step``, a checkpoint at step 10 (the helper
reports it by itself), then ``trained step=STEPS`` and a wait (bounded) for
the file ``RELEASE``, so the test can read the agent's live ``/status``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from torchflex_agent.checkpoint import Checkpointer
from torchflex_agent.progress import report_step


def save(payload: Any, path: Path) -> None:
    path.write_text(repr(payload))


def main() -> None:
    steps, ckpt_dir, release = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    ckpt = Checkpointer(ckpt_dir, save_fn=save)
    for step in range(1, steps + 1):
        time.sleep(0.05)
        report_step(step)
        if step == 10:
            ckpt.save(step, {})
    print(f"trained step={steps}", flush=True)
    deadline = time.monotonic() + 120
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


if __name__ == "__main__":
    main()
