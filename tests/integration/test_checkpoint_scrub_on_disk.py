"""Background checkpoint verification on real checkpoint files: versions written by the engine (DCP
shards, rank extras, signed-digest manifest) on a memory-kind and a disk tier, damaged on disk after
they committed. The scrubber finds and sets aside each damaged copy before any load, and a load then
resumes from the older good version without trying the damaged one; while the engine saves and its
retention deletes old versions under the scrubber's thread, nothing good is called damaged."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def state_for(step: int, n: int = 50_000) -> dict:
    import torch

    g = torch.Generator().manual_seed(step)
    return {"model": {"w": torch.randn(n, generator=g)}, "optim": {"m": torch.randn(n, generator=g)}}


def zeros(n: int = 50_000) -> dict:
    import torch

    return {"model": {"w": torch.zeros(n)}, "optim": {"m": torch.zeros(n)}}


def tiers(root: Path, keep: int):
    from stalwart.checkpoint.tiers import TierConfig

    return [
        TierConfig(name="memory", kind="memory", location=str(root / "shm"), keep=keep),
        TierConfig(name="local", kind="local", location=str(root / "disk"), keep=keep),
    ]


def scrub_tiers(root: Path):
    from stalwart.launch.checkpoint_scrub import ScrubTier

    return [ScrubTier("memory", root / "shm", 0), ScrubTier("local", root / "disk", 1)]


def test_a_damaged_version_is_set_aside_and_the_load_takes_the_older_good_one(tmp_path):
    import torch

    from stalwart.checkpoint.engine import CheckpointEngine
    from stalwart.checkpoint.store import committed_versions, step_name
    from stalwart.events.checkpoint import CheckpointDamaged
    from stalwart.launch.chaos_actions import damage
    from stalwart.launch.checkpoint_scrub import CheckpointScrub
    from stalwart.policy.checkpoint_scrub import Budget
    from stalwart.protocol.run_dir import RunDir

    eng = CheckpointEngine(tiers(tmp_path, keep=3))
    for step in (1, 2, 3):
        assert eng.save(step, state_for(step)).future.result().committed == ("memory", "local")
    eng.close()
    found: list = []
    scrub = CheckpointScrub(
        scrub_tiers(tmp_path),
        run=RunDir(tmp_path / "run"),
        node="n1",
        run_id="r1",
        notify=found.append,
        budget=Budget(duty=1.0, recheck_s=0.0),
        settle=lambda: None,
    )
    for _ in range(6):  # every version verifies clean once
        scrub.poll()
    assert scrub.stats.readings == 6 and not found
    for tier in ("shm", "disk"):  # committed, verified, then damaged where it lies
        assert "flipped 16 bytes" in damage(tmp_path / tier / step_name(3), "corrupt-checkpoint", tier)
    for _ in range(6):
        scrub.poll()
    assert [(e.tier, e.step) for e in found] == [("memory", 3), ("local", 3)]
    assert all(isinstance(e, CheckpointDamaged) and "checksum (SHA-256)" in e.reason for e in found)
    assert found[-1].fallback == "a recovery reads step 2 from the memory tier instead, verified just now"
    for tier in ("shm", "disk"):
        assert [s for s, _ in committed_versions(tmp_path / tier)] == [2, 1]
        assert (tmp_path / tier / f".{step_name(3)}.damaged").is_dir()

    seen: list = []
    eng = CheckpointEngine(tiers(tmp_path, keep=3), sink=seen.append)
    target = zeros()
    got = eng.load_latest(target)
    eng.close()
    assert got is not None and got.step == 2 and got.tier == "memory"
    assert got.rejected == ()  # the damaged version was never tried
    assert not [e for e in seen if type(e).__name__ == "CheckpointRejected"]
    want = state_for(2)
    assert torch.equal(target["model"]["w"], want["model"]["w"])
    assert torch.equal(target["optim"]["m"], want["optim"]["m"])


def test_saves_and_retention_under_the_scrubbers_thread_call_nothing_damaged(tmp_path):
    from stalwart.checkpoint.engine import CheckpointEngine
    from stalwart.launch.checkpoint_scrub import CheckpointScrub
    from stalwart.policy.checkpoint_scrub import Budget
    from stalwart.protocol.run_dir import RunDir

    found: list = []
    scrub = CheckpointScrub(
        scrub_tiers(tmp_path),
        run=RunDir(tmp_path / "run"),
        node="n1",
        run_id="r1",
        notify=found.append,
        budget=Budget(duty=1.0, recheck_s=0.0),  # reading all the time: every deletion races a reading
    ).start()
    eng = CheckpointEngine(tiers(tmp_path, keep=1))
    try:
        for step in range(1, 41):
            assert eng.save(step, state_for(step)).future.result().committed == ("memory", "local")
    finally:
        eng.close()
        scrub.stop()
    assert scrub.stats.readings > 20, scrub.stats
    assert not found, found
    assert not scrub.stats.errors
