"""FSDP2 under `stalwart run`: 4 ranks, 3 injected crashes and a hang, and the final model AND
optimizer state are bit-identical to the uninterrupted run (a user-style script, see scripts/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stalwart.events import FailureDetected, TrainingResumed

from .runner import events, stalwart

pytest.importorskip("torchdata")
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

SCRIPT = str(Path(__file__).resolve().parent / "scripts" / "fsdp_train.py")
STEPS, EVERY = 24, 4
CRASHES = {5: 1, 11: 2, 17: 3}  # step -> rank
HANG_STEP, HANG_RANK = 21, 0


def _same(a, b, where=""):
    import torch

    if isinstance(a, dict):
        assert set(a) == set(b), where
        for k in a:
            _same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}/{i}")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), f"{where} differs"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def test_fsdp2_chaos_run_ends_bit_identical_to_the_uninterrupted_run(tmp_path):
    import torch

    common = ["run", "-q", "--nproc-per-node", "4", "--hang-floor", "2", "--max-restarts", "5"]
    train = [SCRIPT, "--steps", str(STEPS), "--checkpoint-every", str(EVERY)]
    ref = stalwart(*common, "--run-dir", str(tmp_path / "ref"), *train, "--out", str(tmp_path / "ref.pt"))
    assert ref.code == 0, ref.err + ref.out
    chaos = [f"--chaos=crash@rank={r},step={s}" for s, r in CRASHES.items()]
    chaos.append(f"--chaos=hang@rank={HANG_RANK},step={HANG_STEP}")
    run = stalwart(
        *common, "--run-dir", str(tmp_path / "chaos"), *chaos, *train, "--out", str(tmp_path / "chaos.pt")
    )
    assert run.code == 0, run.err + run.out
    failures = events(tmp_path / "chaos", FailureDetected)
    assert [f.failure for f in failures] == ["crash", "crash", "crash", "hang"]
    resumed = [e.step for e in sorted(events(tmp_path / "chaos", TrainingResumed), key=lambda e: e.ts)]
    # one start and four restarts, each from a committed checkpoint (a crash right after a save may
    # come before that save's background persist commits: then the one before is the newest)
    assert len(resumed) == 5 and all(s % EVERY == 0 for s in resumed) and resumed[-1] == 20, resumed
    a = torch.load(tmp_path / "ref.pt", weights_only=True)
    b = torch.load(tmp_path / "chaos.pt", weights_only=True)
    assert int(a["optimizer"]["state"]["layers.0.weight"]["step"]) == STEPS
    _same(a, b)  # every parameter and every Adam moment, bit for bit
