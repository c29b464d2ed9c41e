"""A marked evaluation phase, or a script's own work after its loop, longer than the hang timeout is not a
hang; a hang inside an evaluation is caught once the phase's budget runs out, and the evaluating rank
(not the waiting one) is blamed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stalwart.events import AttemptStarted, FailureDetected, JobEnded
from stalwart.exit_codes import EXIT_INFRA

from .runner import events

SCRIPT = str(Path(__file__).parent / "sdk_scripts" / "eval_phase.py")
RUN = [
    sys.executable,
    "-m",
    "stalwart.cli",
    "run",
    "--no-health-gate",
    "--nproc-per-node",
    "2",
    "--hang-floor",
    "2",
    "--hang-cap",
    "3",
    "--max-restarts",
    "0",
]


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["--eval-seconds", "6", "--budget", "60"], id="a marked evaluation"),
        # rank 0 spends 6 s after its last step (3x the hang cap) without marking a phase
        pytest.param(["--eval-at", "-1", "--after-loop-seconds", "6"], id="work after the loop"),
    ],
)
def test_a_phase_longer_than_the_hang_timeout_is_not_a_hang(tmp_path: Path, args: list[str]):
    p = subprocess.run(
        [*RUN, "--run-dir", str(tmp_path), SCRIPT, *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert events(tmp_path, FailureDetected) == [] and len(events(tmp_path, AttemptStarted)) == 1


def test_a_hang_during_evaluation_is_caught_at_the_phase_budget(tmp_path: Path):
    p = subprocess.run(
        [*RUN, "--run-dir", str(tmp_path), SCRIPT, "--hang-in-eval", "--budget", "8"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == EXIT_INFRA, p.stdout[-3000:]
    hang = events(tmp_path, FailureDetected)
    assert len(hang) == 1 and hang[0].failure == "hang" and hang[0].rank == 0
    assert "phase 'eval'" in hang[0].evidence
    # not before the budget (the agent declares up to one 50 ms monitor tick early, by design)
    assert hang[0].ts - hang[0].onset >= 8.0 - 0.05 and "budget 8.00s" in hang[0].evidence
    assert events(tmp_path, JobEnded)[-1].outcome == "infra_exhausted"
