"""Lightning and Hugging Face Trainer under ``stalwart run``: a crash mid-run, resume through the
framework's own checkpoint, and final weights identical to an uninterrupted run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stalwart.events import (
    CheckpointCommitted,
    FailureDetected,
    JobEnded,
    StepCompleted,
    TrainingResumed,
)

from .runner import events, stalwart

pytestmark = pytest.mark.e2e

SCRIPTS = Path(__file__).parent.parent / "fixtures" / "frameworks"
STEPS, CRASH_STEP = 12, 6  # checkpoints every 4 steps: the crash loses steps 4-5 and resumes at 4


def _run(tmp: Path, script: str, name: str, *extra: str) -> tuple[Path, Path, object]:
    run_dir, out = tmp / name, tmp / f"{name}.json"
    res = stalwart(
        "run",
        "--no-report",
        "--nproc-per-node",
        "2",
        "--run-dir",
        str(run_dir),
        *extra,
        str(SCRIPTS / script),
        str(out),
        str(STEPS),
    )
    return run_dir, out, res


@pytest.mark.parametrize("framework,script", [("lightning", "lightning_train.py"), ("hf", "hf_train.py")])
def test_crash_resumes_exactly_through_the_framework_checkpoint(framework, script, tmp_path):
    pytest.importorskip("lightning" if framework == "lightning" else "transformers")
    # through the checkpoint: a survivor's live state is not left (Lightning's: test_lightning_exact.py)
    run_dir, out, res = _run(
        tmp_path, script, "chaos", "--no-leave-state", "--chaos", f"crash@rank=1,step={CRASH_STEP}"
    )
    assert res.code == 0, res.out[-3000:] + res.err[-3000:]

    crash = events(run_dir, FailureDetected)
    assert [(f.failure, f.rank, f.step) for f in crash] == [("crash", 1, CRASH_STEP)]
    resumed = [e.step for e in events(run_dir, TrainingResumed)]
    assert resumed == [0, 4], resumed  # fresh start, then the newest checkpoint before the crash
    committed = {e.step for e in events(run_dir, CheckpointCommitted)}
    assert {4, 8, 12} <= committed
    done = events(run_dir, StepCompleted)
    assert {s.rank for s in done} == {0, 1} and max(s.step for s in done) == STEPS - 1
    assert all(s.sections for s in done)  # the callback's sections reach the agent
    assert events(run_dir, JobEnded)[-1].exit_code == 0

    _, ref_out, ref = _run(tmp_path, script, "reference")
    assert ref.code == 0, ref.out[-3000:] + ref.err[-3000:]
    got, want = json.loads(out.read_text()), json.loads(ref_out.read_text())
    assert got["global_step"] == want["global_step"] == STEPS
    assert got["weights"] == want["weights"]


def test_hf_resumes_from_the_state_the_survivor_left_with_nothing_redone_and_exactly(tmp_path):
    """Rank 0 SIGKILLed as step 6 begins (checkpoints every 4): rank 1's ``train`` fails in that step's
    all-reduce and it leaves a ``checkpoint-6`` of the last completed step in node memory
    (integrations/hf_left.py: written by whichever rank survives, not only by the group's rank 0 as
    ``save_pretrained`` would); the restarted group resumes there, not at checkpoint-4, rank 0 from
    rank 1's directory, each rank with its own RNG record of step 6, and ends with the uninterrupted
    run's weights, value for value."""
    pytest.importorskip("transformers")
    run_dir, out, res = _run(tmp_path, "hf_train.py", "chaos", "--chaos", f"crash@rank=0,step={CRASH_STEP}")
    assert res.code == 0, res.out[-3000:] + res.err[-3000:]
    resumed = [(e.step, e.from_checkpoint) for e in events(run_dir, TrainingResumed)]
    assert resumed[0][0] == 0 and resumed[1:] == [(CRASH_STEP, "live:rank1:node-memory")], resumed
    _, ref_out, ref = _run(tmp_path, "hf_train.py", "reference")
    assert ref.code == 0, ref.out[-3000:] + ref.err[-3000:]
    got, want = json.loads(out.read_text()), json.loads(ref_out.read_text())
    assert got["global_step"] == want["global_step"] == STEPS
    assert got["weights"] == want["weights"]


@pytest.mark.parametrize("framework,script", [("lightning", "lightning_train.py"), ("hf", "hf_train.py")])
def test_sigterm_to_the_agent_saves_an_emergency_checkpoint_and_the_requeue_resumes_there(
    framework, script, tmp_path
):
    pytest.importorskip("lightning" if framework == "lightning" else "transformers")
    import os
    import signal
    import subprocess
    import sys

    run_dir, out = tmp_path / "run", tmp_path / "out.json"
    argv = [
        sys.executable,
        "-m",
        "stalwart.cli",
        "run",
        "--no-report",
        "--nproc-per-node",
        "2",
        "--run-dir",
        str(run_dir),
        str(SCRIPTS / script),
        str(out),
        "40",
    ]
    agent = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "STEP_SLEEP_S": "0.3"},
    )
    seen = []
    for line in agent.stdout:  # the first progress line: training is under way on every rank
        seen.append(line)
        if line.startswith("  step "):  # not a wrapped line's continuation, indented deeper
            agent.send_signal(signal.SIGTERM)
            break
    rest, _ = agent.communicate(timeout=300)
    assert agent.returncode == 76, "".join(seen) + rest

    emergency = [e for e in events(run_dir, CheckpointCommitted) if e.emergency]
    assert len(emergency) == 1 and 0 < emergency[0].step < 40
    again = stalwart(
        "run",
        "--no-report",
        "--nproc-per-node",
        "2",
        "--run-dir",
        str(run_dir),
        str(SCRIPTS / script),
        str(out),
        "40",
    )
    assert again.code == 0, again.out[-3000:] + again.err[-3000:]
    assert events(run_dir, TrainingResumed)[-1].step == emergency[0].step
    assert json.loads(out.read_text())["global_step"] == 40
