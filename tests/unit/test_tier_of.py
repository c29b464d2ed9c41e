"""The suite's per-tier time summary sorts each test into its tier by folder (tests/conftest.py)."""

from __future__ import annotations

from conftest import tier_of


def test_tests_are_sorted_into_their_tier_by_folder():
    assert tier_of("tests/unit/test_x.py::test_a") == "unit"
    assert tier_of("tests/integration/test_y.py::test_b[1]") == "integration"
    assert tier_of("tests/e2e/test_z.py::test_c") == "e2e"
    assert tier_of("tests/test_top.py::test_d") == "other"
    assert tier_of("elsewhere/unit/test_w.py::test_e") == "other"
