"""``make bench``: runs every benchmark (none has landed yet; says so)."""

from __future__ import annotations

import sys


def main() -> int:
    print("make bench: no benchmark has landed yet (see the benchmarks issue)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
