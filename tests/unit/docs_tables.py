"""The tables of docs/*.md as cells, for the unit tests that hold the docs to the code.

Where it sits: imported by tests/unit/test_vocabulary.py (exit codes, store
keys) and tests/unit/test_defaults.py (the agent's flags).
"""

from __future__ import annotations

import re

from e2e.cluster.layout import REPO_ROOT


def doc_table(doc: str, after: str) -> list[list[str]]:
    """The cells of the first table after the text ``after`` in docs/``doc``, its
    header rows left out; an escaped ``\\|`` stays inside its cell."""
    lines = (REPO_ROOT / "docs" / doc).read_text().split(after, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows: list[list[str]] = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    return rows[2:]
