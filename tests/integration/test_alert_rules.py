"""The shipped alert rules load in Prometheus' own checker and fire (only) where their unit tests expect."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from stalwart.serve.rules import rules_path

pytestmark = pytest.mark.integration
FIXTURE = Path(__file__).parents[1] / "fixtures" / "alerts_test.yml"


def _promtool() -> str:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.skip("promtool is not installed (Debian package prometheus; .ci/run installs it)")
    return exe


def test_rules_file_is_valid():
    p = subprocess.run(
        [_promtool(), "check", "rules", str(rules_path())], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "9 rules found" in p.stdout


def test_rules_fire_as_their_unit_tests_expect(tmp_path):
    # run against the packaged file (the one users load), not only the source tree's
    shutil.copy(rules_path(), tmp_path / "alerts.yml")
    text = FIXTURE.read_text().replace("../../src/stalwart/serve/alerts.yml", "alerts.yml")
    (tmp_path / "alerts_test.yml").write_text(text)
    p = subprocess.run(
        [_promtool(), "test", "rules", "alerts_test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout + p.stderr


def test_a_wrong_threshold_is_caught(tmp_path):
    """The unit tests can fail: loosen the storm threshold and promtool must report a mismatch."""
    rules = rules_path().read_text().replace("[15m])) >= 3", "[15m])) >= 4")
    assert rules != rules_path().read_text()
    (tmp_path / "alerts.yml").write_text(rules)
    text = FIXTURE.read_text().replace("../../src/stalwart/serve/alerts.yml", "alerts.yml")
    (tmp_path / "alerts_test.yml").write_text(text)
    p = subprocess.run(
        [_promtool(), "test", "rules", "alerts_test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode != 0
    assert "StalwartRestartStorm" in p.stdout + p.stderr
