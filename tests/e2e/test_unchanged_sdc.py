"""Silent data corruption in an unchanged script (issue 41, point 5): the bootstrap's optimizer step
hooks run the cross-replica check a Session's loop runs. Three DDP ranks of a plain torchrun script
(no Stalwart import); rank 1 flips one exponent bit of a weight after step 32, once (as a faulty GPU
would). With a check every 5 steps it is found within 5 steps, rank 1 is named (two of three
replicas agree), and since Stalwart saw no checkpoint verified clean for a script that saves its
own, the ranks stop with the error; the agent restarts them, the script resumes from its own
checkpoint of step 30 (saved before the flip) and the run ends with no second detection."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stalwart.events import IncidentRaised, TrainingResumed
from stalwart.events.integrity import SilentCorruption

from .runner import events

pytestmark = pytest.mark.e2e

SCRIPT = str(Path(__file__).parent / "scripts" / "ddp_steps.py")
RUN = [
    sys.executable,
    "-m",
    "stalwart.cli",
    "run",
    "--no-health-gate",
    "--nproc-per-node",
    "3",
    "--run-dir",
    "run",
]


def test_a_flipped_bit_in_an_unchanged_script_is_found_within_the_interval_and_its_rank_named(tmp_path: Path):
    cmd = [*RUN, "--sdc-every", "5", SCRIPT, "--step-s", "0.02", "--flip-at", "32"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    run = tmp_path / "run"
    [found] = events(run, SilentCorruption)  # once: the resumed run is clean
    assert found.suspect_ranks == (1,) and found.verdict == "odd_one_out", found
    assert 33 < found.step <= 33 + 5, found  # the flip left step 32 (33 done); a check every 5 steps
    assert found.action == "halt" and "nothing safe to roll back to" in found.reason
    [incident] = [e for e in events(run, IncidentRaised) if e.rule == "sdc:replica-mismatch"]
    assert incident.ranks == (1,) and "rank 1" in incident.cause, incident
    resumed = [e for e in events(run, TrainingResumed) if e.attempt == 1]
    assert [e.step for e in resumed] == [30], resumed  # the script's own checkpoint before the flip
