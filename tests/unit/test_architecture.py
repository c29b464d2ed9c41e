"""The architecture rules that CI checks (docs/architecture.md), and that the checks can fail."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from module_size import LIMIT, oversized  # noqa: E402


def test_no_module_in_src_is_over_the_limit():
    assert oversized() == []


def test_the_size_check_names_a_module_over_the_limit(tmp_path):
    pkg = tmp_path / "stalwart"
    pkg.mkdir()
    (pkg / "small.py").write_text("x = 1\n")
    (pkg / "big.py").write_text("x = 1\n" * (LIMIT + 1))
    assert oversized(pkg) == [("stalwart/big.py", LIMIT + 1)]
