"""An exception is never classified as a hang, however slowly the raising worker exits, and a
requeued job never reads the previous job's error records as its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stalwart.events import FailureDetected, JobEnded
from stalwart.exit_codes import EXIT_USER_ERROR
from stalwart.protocol.run_dir import RunDir

from .runner import events

pytestmark = pytest.mark.e2e

SCRIPT = str(Path(__file__).parent / "sdk_scripts" / "slow_exit_raise.py")


def test_a_slow_exit_after_an_exception_is_an_exception_not_a_hang(tmp_path: Path):
    # a stale record of an earlier job at the same attempt numbers must not be read as this job's
    stale = RunDir(tmp_path).create().error_file("n0", 0, 0)
    stale.write_text(
        '{"type": "builtins.KeyError", "message": "old bug", "traceback": "", "step": 1, "ts": 1}'
    )
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "stalwart.cli",
            "run",
            "-q",
            "--no-health-gate",
            "--nproc-per-node",
            "2",
            "--node-name",
            "n0",
            "--hang-floor",
            "2",
            "--stop-grace",
            "8",
            "--run-dir",
            str(tmp_path),
            SCRIPT,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == EXIT_USER_ERROR, p.stdout[-3000:] + p.stderr[-2000:]
    failures = events(tmp_path, FailureDetected)
    assert [f.failure for f in failures] == ["exception", "exception"], failures
    assert all(f.rank == 1 and "bad batch" in f.evidence for f in failures), failures
    assert "user error" in events(tmp_path, JobEnded)[-1].verdict
    assert not any("old bug" in f.evidence for f in failures)
    assert list(tmp_path.glob("errors/earlier-*/n0-a0-r0.json")), "the earlier job's record was kept aside"
