"""``torchflex-agent`` entry point (placeholder until it lands)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("torchflex-agent: not yet implemented", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
