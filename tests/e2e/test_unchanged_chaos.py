"""Chaos for unchanged scripts (no Stalwart import): the bootstrap's step hooks fire step faults at
the planned rank and step and the ledger counts them; checkpoint damage is refused with one error and
exit 2; a planned fault that never fired is said, not dropped (issue 38, point 2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stalwart.events import ChaosInjected, ChaosUnfired, FailureDetected, IncidentRaised, JobEnded

from .runner import console, events

pytestmark = pytest.mark.e2e

SCRIPT = str(Path(__file__).parent / "user_scripts" / "lowcpu_trainer.py")
STALWART = [sys.executable, "-m", "stalwart.cli", "run", "--no-health-gate", "--nproc-per-node", "2"]


def test_a_crash_planned_for_an_unchanged_script_fires_at_its_rank_and_step_and_the_run_recovers(
    tmp_path: Path,
):
    cmd = [
        *STALWART,
        "--run-dir",
        "run",
        "--chaos",
        "crash@rank=1,step=5",
        "--chaos",
        "crash@rank=0,step=500",
    ]
    cmd += [SCRIPT, "--steps", "10", "--idle", "0.05"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    out = console(p.stdout + p.stderr)  # the console's lines whole
    assert p.returncode == 0, out[-4000:]
    run = tmp_path / "run"
    [fired] = events(run, ChaosInjected)
    assert (fired.fault, fired.rank, fired.step) == ("crash", 1, 5)
    [failure] = events(run, FailureDetected)
    assert failure.rank == 1 and failure.failure == "crash", failure
    # labelled as the plan's, not "killed from outside the job": incident, hence report and dashboard
    [incident] = events(run, IncidentRaised)
    assert incident.cause.startswith("rank 1 killed by the chaos plan (crash at rank 1, step 5"), incident
    assert events(run, JobEnded)[-1].outcome == "succeeded"
    # the fault past the run's last step is said on the console and kept for the report
    assert "planned fault(s) never fired: 'crash@rank=0,step=500'" in out
    [unfired] = events(run, ChaosUnfired)
    assert unfired.faults == ("crash@rank=0,step=500",)


def test_checkpoint_damage_planned_for_an_unchanged_script_is_refused_with_exit_2(tmp_path: Path):
    cmd = [*STALWART, "--run-dir", "run", "--chaos", "corrupt-checkpoint@step=5"]
    cmd += [SCRIPT, "--steps", "1000", "--idle", "0.05"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    out = console(p.stdout + p.stderr)  # the console's lines whole
    assert p.returncode == 2, out[-4000:]
    assert "fault 'corrupt-checkpoint@step=5' needs the Stalwart SDK (Session)" in out
    assert "drop the fault" in out
    end = events(tmp_path / "run", JobEnded)[-1]
    assert end.exit_code == 2 and "needs the Stalwart SDK" in end.verdict


def test_a_hang_planned_for_an_unchanged_script_is_detected_and_labelled_injected_everywhere(tmp_path: Path):
    cmd = [*STALWART, "--run-dir", "run", "--hang-floor", "2", "--chaos", "hang@rank=1,step=4"]
    cmd += [SCRIPT, "--steps", "8", "--idle", "0.05"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    out = console(p.stdout + p.stderr)  # the console's lines whole
    assert p.returncode == 0, out[-4000:]
    run = tmp_path / "run"
    [fired] = events(run, ChaosInjected)
    assert (fired.fault, fired.rank, fired.step) == ("hang", 1, 4)
    [hang] = events(run, FailureDetected)
    # both ranks are silent (rank 0 waits for rank 1 in the all-reduce): whichever the monitor names,
    # the failure carries the plan's entry
    assert (hang.failure, hang.injected) == ("hang", "hang at rank 1, step 4"), hang
    assert "(injected by the chaos plan: hang at rank 1, step 4)" in out  # the console
    [incident] = events(run, IncidentRaised)
    assert incident.rule == "cross_layer:chaos-injected", incident  # the incident, hence report and dashboard
    assert "injected by the chaos plan (hang at rank 1, step 4)" in incident.cause
