"""e2e tier: no test's run may carry a finding of silent data corruption or a training anomaly
unless it injects one (issue 41: a detector that fires on healthy jobs is worse than none). After
each test, every ledger under its ``tmp_path`` is read; the soak checks its own work directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .runner import integrity_findings

# the tests that inject corruption (a flipped bit), so a finding is what they assert
INJECTS_CORRUPTION = frozenset({"test_sdc.py", "test_sdc_nodes.py", "test_unchanged_sdc.py"})


@pytest.fixture(autouse=True)
def no_false_corruption(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[None]:
    yield
    if request.node.path.name in INJECTS_CORRUPTION:
        return
    found = integrity_findings(tmp_path)
    assert not found, f"a healthy run was flagged: {found}"
