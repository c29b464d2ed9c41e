"""Unchanged torchrun scripts (no Stalwart import) under ``stalwart run``: torchrun's signal
semantics, and a healthy low-CPU job with long waits is never a hang."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stalwart.events import (
    FailureDetected,
    IncidentRaised,
    JobEnded,
    StackCaptured,
    StepCompleted,
    TimeoutsCalibrated,
    WorkersStarted,
)
from stalwart.exit_codes import EXIT_INFRA, EXIT_PREEMPTED

from .runner import console, events, events_so_far

pytestmark = pytest.mark.e2e

SCRIPT = str(Path(__file__).parent / "user_scripts" / "lowcpu_trainer.py")
STALWART = [sys.executable, "-m", "stalwart.cli", "run", "--no-health-gate", "--nproc-per-node", "2"]


def _signalled(tmp_path: Path, mode: str, sig: int) -> tuple[subprocess.Popen, str]:
    cmd = [*STALWART, "--run-dir", "run", SCRIPT, "--steps", "40", "--idle", "0.2"]
    cmd += ["--flag", str(tmp_path / "handled"), "--on-signal", mode]
    agent = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        log = tmp_path / "run" / "logs"
        deadline = time.time() + 120
        while time.time() < deadline:  # both ranks have their handlers installed
            text = (
                "".join(p.read_text(errors="replace") for p in log.glob("*-r*.log")) if log.exists() else ""
            )
            if "rank 0 step 2" in text and "rank 1 step 2" in text:
                break
            time.sleep(0.2)
        agent.send_signal(sig)
        out, _ = agent.communicate(timeout=120)
    finally:
        if agent.poll() is None:
            agent.kill()
    return agent, out


def test_sigterm_reaches_the_scripts_handler_and_a_stopped_job_is_preempted(tmp_path: Path):
    agent, out = _signalled(tmp_path, "die", signal.SIGTERM)
    assert agent.returncode == EXIT_PREEMPTED, out[-3000:]
    assert {p.name: p.read_text() for p in tmp_path.glob("handled.*")} == {
        "handled.0": "SIGTERM",
        "handled.1": "SIGTERM",
    }
    assert (tmp_path / "snapshot.0.pt").exists()  # the script saved its own snapshot
    end = events(tmp_path / "run", JobEnded)[-1]
    assert end.outcome == "preempted" and "script's own checkpoints" in end.verdict


def test_sigusr1_to_a_script_that_finishes_its_loop_is_a_success(tmp_path: Path):
    agent, out = _signalled(tmp_path, "finish", signal.SIGUSR1)
    assert agent.returncode == 0, out[-3000:]
    assert (tmp_path / "handled.0").read_text() == "SIGUSR1"
    end = events(tmp_path / "run", JobEnded)[-1]
    assert end.outcome == "succeeded" and end.exit_code == 0
    assert events(tmp_path / "run", FailureDetected) == []


def test_a_low_cpu_job_with_long_io_waits_is_no_hang_its_steps_come_from_the_hooks(tmp_path: Path):
    # every rank is idle for 6 s at a time, longer than --cpu-stall 4: idleness alone once killed it;
    # the optimizer step hooks give the steps, and the waits are in the calibration
    cmd = [*STALWART, "--run-dir", "run", "--cpu-stall", "4", "--hang-floor", "1", SCRIPT]
    cmd += ["--steps", "6", "--idle", "0.5", "--io-rank", "1", "--io-wait", "6", "--io-every", "3"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    run = tmp_path / "run"
    assert events(run, FailureDetected) == []
    steps = events(run, StepCompleted)
    assert sorted((e.rank, e.step) for e in steps) == [(r, s) for r in (0, 1) for s in range(6)]
    waited = [e for e in steps if e.step in (1, 4)]
    assert all(e.duration >= 6.0 for e in waited)  # data waits are part of the step, as the job sees it


def test_a_stopped_hooked_rank_is_a_hang_caught_by_its_step_timeout_with_stacks(tmp_path: Path):
    run = tmp_path / "run"
    cmd = [*STALWART, "--run-dir", str(run), "--node-name", "n0", "--hang-floor", "2", "--max-restarts", "0"]
    cmd += [SCRIPT, "--steps", "100000", "--idle", "0.1"]
    agent = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and len(events_so_far(run, StepCompleted)) < 20:
            time.sleep(0.3)
        started = events(run, WorkersStarted)[-1]
        pid = dict(zip(started.global_ranks, started.pids, strict=True))[1]
        os.kill(pid, signal.SIGSTOP)
        out, _ = agent.communicate(timeout=120)
    finally:
        if agent.poll() is None:
            agent.kill()
    assert agent.returncode == EXIT_INFRA, out[-3000:]
    (hang,) = events(run, FailureDetected)
    assert hang.failure == "hang" and hang.rank == 1, hang
    calibrated = events(run, TimeoutsCalibrated)
    assert calibrated and calibrated[0].hang_timeout_s == 2.0  # the floor: steps of ~0.1 s
    stacks = {e.rank: e.stack for e in events(run, StackCaptured)}
    assert "lowcpu_trainer.py" in stacks.get(0, ""), stacks  # the waiting peer's stack, without the SDK
    # the stopped rank's own stack: faulthandler cannot run in it, py-spy reads it from outside
    assert "py-spy" in stacks.get(1, "") and "lowcpu_trainer.py" in stacks.get(1, ""), stacks
    # and the incident says the strongest fact: the rank was stopped (not "no node-level cause")
    (incident,) = events(run, IncidentRaised)
    assert incident.rule == "cross_layer:rank-stopped", incident
    assert incident.cause.startswith("rank 1 on n0 was stopped (state T"), incident.cause
    said = console(out)
    assert "(the rank is stopped: state T)" in said and "innermost:" in said  # the console says it too


def test_a_finished_run_stays_finished_and_a_changed_script_is_bad_input(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text(Path(SCRIPT).read_text())
    cmd = [*STALWART, "--run-dir", "run", str(script), "--steps", "3", "--idle", "0.05"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]
    said = console(again.stdout)
    assert "already finished at step 2" in said and "nothing launched" in said
    assert len(events(tmp_path / "run", JobEnded)) == 1  # nothing ran: no second verdict
    script.write_text(script.read_text() + "\n# edited\n")
    changed = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert changed.returncode == 2 and "--continue-changed" in changed.stdout + changed.stderr


def test_a_stopped_rank_of_a_job_without_an_optimizer_is_caught_by_process_state_with_peer_stacks(
    tmp_path: Path,
):
    # no optimizer: no hook ever fires; the stopped process is the evidence, after the hang floor
    run = tmp_path / "run"
    cmd = [*STALWART, "--run-dir", str(run), "--node-name", "n0", "--hang-floor", "2", "--max-restarts", "0"]
    cmd += [SCRIPT, "--steps", "100000", "--idle", "0.1", "--no-optimizer"]
    agent = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        log = run / "logs" / "n0-a0-r1.log"
        deadline = time.time() + 120
        while time.time() < deadline and not (log.exists() and "rank 1 step 10" in log.read_text()):
            time.sleep(0.3)
        started = events(run, WorkersStarted)[-1]
        os.kill(dict(zip(started.global_ranks, started.pids, strict=True))[1], signal.SIGSTOP)
        out, _ = agent.communicate(timeout=120)
    finally:
        if agent.poll() is None:
            agent.kill()
    assert agent.returncode == EXIT_INFRA, out[-3000:]
    (hang,) = events(run, FailureDetected)
    assert hang.rank == 1 and "state T" in hang.evidence, hang
    assert events(run, StepCompleted) == []  # nothing counted that did not happen
    stacks = {e.rank: e.stack for e in events(run, StackCaptured)}
    assert "lowcpu_trainer.py" in stacks.get(0, ""), stacks  # the bootstrap's faulthandler
    assert "lowcpu_trainer.py" in stacks.get(1, ""), stacks  # py-spy, from outside the stopped rank
