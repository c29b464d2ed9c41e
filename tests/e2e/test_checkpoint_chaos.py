"""A corrupted newest checkpoint in a real run: rejected with its reason, the run resumes from the
newest good one, and still ends bit-identical to an uninterrupted run."""

from __future__ import annotations

import re

import pytest

from stalwart.events import ChaosInjected, CheckpointLoaded, CheckpointRejected, JobEnded, TrainingResumed

from .runner import EXAMPLE, events, same_params, stalwart

pytestmark = pytest.mark.e2e

JOB = [*EXAMPLE, "--steps", "24", "--checkpoint-every", "4"]


def _damaged_run(tmp_path, damage: str):
    """One run whose rank 0 crashes at step 15 and whose newest committed checkpoint is damaged when
    that attempt fails: with the workers gone nothing commits any more, so the damaged version is
    the one the restart reads (fault defined on the checkpoint, not on timing). Returns its run
    directory and the damaged step."""
    run_dir = tmp_path / "run"
    run = stalwart(
        "run",
        "-q",
        "--nproc-per-node",
        "2",
        "--run-dir",
        str(run_dir),
        "--chaos",
        f"{damage}@step=15,on=failure",
        "--chaos",
        "crash@rank=0,step=15",
        "--no-in-place",  # the restart must load a checkpoint (in place it would take the live state)
        "--no-leave-state",  # ... and so would a whole-group restart from the state the survivors left
        *JOB,
        "--out",
        str(tmp_path / "run.pt"),
    )
    assert run.code == 0, run.out + run.err
    evs = events(run_dir)
    hit = next(e for e in evs if isinstance(e, ChaosInjected) and e.fault == damage)
    damaged_step = int(re.search(r"step-(\d+)", hit.detail).group(1))
    return run_dir, damaged_step


@pytest.mark.parametrize("damage", ["corrupt-checkpoint", "truncate-checkpoint"])
def test_damaged_checkpoint_is_skipped_and_nothing_good_is_lost(tmp_path, damage):
    ref = stalwart(
        "run",
        "-q",
        "--nproc-per-node",
        "2",
        "--run-dir",
        str(tmp_path / "ref"),
        *JOB,
        "--out",
        str(tmp_path / "ref.pt"),
    )
    assert ref.code == 0, ref.out + ref.err
    run_dir, damaged_step = _damaged_run(tmp_path, damage)
    evs = events(run_dir)
    resumed = [e for e in evs if isinstance(e, TrainingResumed) and e.attempt == 1]
    assert resumed, "the run restarted after the crash"
    rejected = [e for e in evs if isinstance(e, CheckpointRejected) and e.step == damaged_step]
    assert rejected, "the damaged checkpoint was rejected on load, with a reason"
    assert any(word in rejected[0].reason for word in ("checksum", "bytes", "truncated", "corrupt")), (
        rejected[0]
    )
    assert resumed[0].step == damaged_step - 4, "resumed from the newest good checkpoint"
    assert not [e for e in evs if isinstance(e, CheckpointLoaded) and e.step == damaged_step]
    assert events(run_dir, JobEnded)[-1].outcome == "succeeded"
    assert same_params(tmp_path / "ref.pt", tmp_path / "run.pt")
