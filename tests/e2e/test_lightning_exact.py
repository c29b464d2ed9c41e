"""Lightning resumes bit-identically mid-epoch: a Dropout(0.1) model on a shuffled StatefulDataLoader,
killed (SIGKILL) or stopped (SIGTERM to the agent, emergency checkpoint, requeue) between two epoch
boundaries, ends with the weights of an uninterrupted run; a plain DataLoader gets one warning."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from stalwart.events import CheckpointCommitted, TrainingResumed

from .runner import events, stalwart

pytestmark = pytest.mark.e2e
pytest.importorskip("lightning")
pytest.importorskip("torchdata")

SCRIPT = str(Path(__file__).parent.parent / "fixtures" / "frameworks" / "lightning_train.py")
STEPS, PER_EPOCH = 16, 4  # 16 samples, 2 ranks x batch 2
ENV = {"FIXTURE_LOADER": "stateful", "FIXTURE_EVERY": "3"}  # saves at 3, 6, 9, 12, 15: mid-epoch
WARNING = "StalwartCallback: the training DataLoader has no state_dict"


def _argv(run_dir: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "stalwart.cli", "run", "--no-report", "--nproc-per-node", "2",
            "--run-dir", str(run_dir), *extra, SCRIPT, str(out), str(STEPS)]  # fmt: skip


def _run(run_dir: Path, out: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _argv(run_dir, out, *extra), env={**os.environ, **env}, capture_output=True, text=True, timeout=400
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("reference")
    res = _run(tmp / "run", tmp / "out.json", ENV)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert WARNING not in res.stdout + res.stderr  # a stateful loader: nothing to warn about
    return json.loads((tmp / "out.json").read_text())


def test_sigkill_mid_epoch_resumes_bit_identically(tmp_path: Path, reference: dict):
    """Through the checkpoint (the survivors' live state not left): the newest save, mid-epoch."""
    out = tmp_path / "out.json"
    res = _run(tmp_path / "run", out, ENV, "--no-leave-state", "--chaos", "crash@rank=1,step=8")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    resumed = [e.step for e in events(tmp_path / "run", TrainingResumed)]
    assert resumed == [0, 6] and 6 % PER_EPOCH != 0, resumed  # the newest save, mid-epoch
    got = json.loads(out.read_text())
    assert got["global_step"] == STEPS and got["weights"] == reference["weights"]


def test_sigkill_resumes_from_the_state_the_survivor_left_with_nothing_redone_bit_identically(
    tmp_path: Path, reference: dict
):
    """Rank 1 SIGKILLed as step 10 begins (saves at 3, 6, 9): rank 0 fails in that step's all-reduce
    and leaves Lightning's checkpoint of step 10's start in node memory (integrations/lightning_left.py);
    the restarted group resumes there, not at the step-9 checkpoint, rank 1 from rank 0's file with its
    own RNG record, and ends with the weights of the uninterrupted run."""
    run_dir, out = tmp_path / "run", tmp_path / "out.json"
    res = _run(run_dir, out, ENV, "--chaos", "crash@rank=1,step=10")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    resumed = [(e.step, e.from_checkpoint) for e in events(run_dir, TrainingResumed)]
    assert resumed[0][0] == 0 and resumed[1:] == [(10, "live:rank0:node-memory")], resumed
    assert 10 % PER_EPOCH != 0  # mid-epoch: the data position came from the left state too
    got = json.loads(out.read_text())
    assert got["global_step"] == STEPS and got["weights"] == reference["weights"]


def test_sigterm_mid_epoch_resumes_bit_identically(tmp_path: Path, reference: dict):
    run_dir, out = tmp_path / "run", tmp_path / "out.json"
    agent = subprocess.Popen(
        _argv(run_dir, out),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **ENV, "STEP_SLEEP_S": "0.3"},
    )
    assert agent.stdout is not None
    seen = []
    for line in agent.stdout:  # signal just past an epoch boundary: the stop lands mid-epoch
        seen.append(line)
        m = re.match(r"  step (\d+)/", line)  # a progress line, not a wrapped line's continuation
        if m and int(m.group(1)) % PER_EPOCH == 1:
            agent.send_signal(signal.SIGTERM)
            break
    rest, _ = agent.communicate(timeout=300)
    assert agent.returncode == 76, "".join(seen) + rest
    emergency = [e.step for e in events(run_dir, CheckpointCommitted) if e.emergency]
    assert len(emergency) == 1 and emergency[0] % PER_EPOCH != 0, emergency
    again = _run(run_dir, out, ENV)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert events(run_dir, TrainingResumed)[-1].step == emergency[0]
    got = json.loads(out.read_text())
    assert got["global_step"] == STEPS and got["weights"] == reference["weights"]


def test_a_plain_dataloader_is_warned_about_once(tmp_path: Path):
    res = stalwart("run", "--no-report", "--nproc-per-node", "2", "--run-dir", str(tmp_path / "run"),
                   SCRIPT, str(tmp_path / "out.json"), "2")  # fmt: skip
    assert res.code == 0, res.out[-3000:] + res.err[-3000:]
    assert (res.out + res.err).count(WARNING) == 1


def test_a_plain_dataloader_resumed_mid_epoch_is_told_precisely_what_differs(tmp_path: Path):
    """A plain DataLoader(shuffle=True) cannot restore its position: the warning at the resume names
    the step, the batch and the epoch, says what Lightning does instead, and how to resume exactly;
    and what it says holds: the weights differ from the same plain job run without the kill."""
    plain = {"FIXTURE_EVERY": "3"}
    whole = _run(tmp_path / "whole", tmp_path / "whole.json", plain)
    assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-3000:]
    # through the checkpoint (--no-leave-state): its position is what the warning is about
    res = _run(
        tmp_path / "run", tmp_path / "out.json", plain, "--no-leave-state", "--chaos", "crash@rank=1,step=8"
    )
    text = res.stdout + res.stderr
    assert res.returncode == 0, text[-3000:]
    assert [e.step for e in events(tmp_path / "run", TrainingResumed)] == [0, 6]
    said = " ".join(text.split())  # the warning may be wrapped
    assert "resumed at step 6, batch 2 of epoch 1 (4 an epoch)" in said, text[-3000:]
    assert "its batches 2-3) comes from the start of a new pass over the loader" in said
    assert "StatefulDataLoader" in said and "checkpoint_every a multiple of 4" in said
    got, ref = (
        json.loads((tmp_path / "out.json").read_text()),
        json.loads((tmp_path / "whole.json").read_text()),
    )
    assert got["global_step"] == ref["global_step"] == STEPS
    assert got["weights"] != ref["weights"]  # what the warning says differs does differ
