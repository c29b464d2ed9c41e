"""The size rule of docs/architecture.md: no module in src/ over 500 lines. Run by .ci/run and by
tests/unit/test_architecture.py; exits 1 naming the modules over the limit."""

from __future__ import annotations

import sys
from pathlib import Path

LIMIT = 500
SRC = Path(__file__).resolve().parent.parent / "src" / "stalwart"


def oversized(root: Path = SRC, limit: int = LIMIT) -> list[tuple[str, int]]:
    out = []
    for path in sorted(root.rglob("*.py")):
        n = len(path.read_text().splitlines())
        if n > limit:
            out.append((str(path.relative_to(root.parent)), n))
    return out


if __name__ == "__main__":
    over = oversized()
    for name, n in over:
        print(f"{name}: {n} lines (limit {LIMIT}): split it by role", file=sys.stderr)
    sys.exit(1 if over else 0)
