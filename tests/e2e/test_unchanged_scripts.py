"""Unchanged torchrun scripts (no Stalwart import) under ``stalwart run``: torchrun's signal
semantics, and a healthy low-CPU job with long waits is never a hang."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stalwart.events import FailureDetected, JobEnded
from stalwart.exit_codes import EXIT_PREEMPTED

from .runner import events

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
            text = "".join(p.read_text(errors="replace") for p in log.glob("*-r*.log")) if log.exists() else ""
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
