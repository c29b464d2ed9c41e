"""Agent-side checkpoint damage: which version it hits, and when it must wait."""

from __future__ import annotations

from pathlib import Path

import pytest

from stalwart.chaos.plan import FaultKind
from stalwart.checkpoint.manifest import MANIFEST
from stalwart.launch.chaos_actions import committed, damage, newest_checkpoint, newest_on_its_way


def _version(root: Path, step: int, *, committed: bool = True) -> Path:
    name = f"step-{step:09d}" if committed else f".step-{step:09d}.partial"
    d = root / name
    d.mkdir(parents=True)
    (d / "__0_0.distcp").write_bytes(bytes(range(256)) * 8)
    if committed:
        (d / MANIFEST).write_text("{}")
    return d


def test_the_newest_version_on_its_way_is_pinned_until_it_commits(tmp_path):
    disk, mem = tmp_path / "disk", tmp_path / "mem"
    assert newest_on_its_way(disk, [mem, tmp_path / "absent"]) == -1  # nothing anywhere
    _version(disk, 8)
    _version(mem, 8)
    assert newest_on_its_way(disk, [mem]) == 8
    _version(mem, 12, committed=False)  # the memory tier is written first
    assert newest_on_its_way(disk, [mem]) == 12
    assert committed(disk, 12) is None  # not on disk yet: the damage waits
    (mem / ".step-000000012.partial").rename(mem / "step-000000012")
    (mem / "step-000000012" / MANIFEST).write_text("{}")
    _version(disk, 12, committed=False)
    assert newest_on_its_way(disk, [mem]) == 12 and committed(disk, 12) is None
    (disk / ".step-000000012.partial").rename(disk / "step-000000012")
    (disk / "step-000000012" / MANIFEST).write_text("{}")
    assert committed(disk, 12) == disk / "step-000000012"
    assert committed(disk, 8) == disk / "step-000000008"


def test_damage_hits_the_newest_committed_version(tmp_path):
    _version(tmp_path, 4)
    newest = _version(tmp_path, 8)
    _version(tmp_path, 12, committed=False)
    assert newest_checkpoint(tmp_path) == newest
    before = (newest / "__0_0.distcp").read_bytes()
    assert "truncated" in damage(newest, "truncate-checkpoint")
    assert (newest / "__0_0.distcp").stat().st_size == len(before) // 2
    older = tmp_path / "step-000000004" / "__0_0.distcp"
    assert "flipped" in damage(tmp_path / "step-000000004", "corrupt-checkpoint")
    assert older.read_bytes() != before and len(older.read_bytes()) == len(before)


def test_only_checkpoint_faults_damage_a_checkpoint(tmp_path):
    version = _version(tmp_path, 4)
    before = (version / "__0_0.distcp").read_bytes()
    for kind in ("crash", "kill-agent", "slow"):
        with pytest.raises(ValueError, match="does not damage a checkpoint"):
            damage(version, kind)
    assert (version / "__0_0.distcp").read_bytes() == before
    assert "flipped" in damage(version, FaultKind.CORRUPT_CHECKPOINT)


class _Memory:
    def __init__(self, root: Path) -> None:
        self.versions_root = root

    def version_dir(self, name: str) -> Path | None:
        path = self.versions_root / name
        return path if (path / MANIFEST).exists() else None


def test_damage_on_failure_waits_for_the_failure_then_hits_the_newest_committed_in_any_tier(tmp_path):
    from stalwart.chaos.plan import FaultPlan, parse_spec
    from stalwart.events import ChaosInjected
    from stalwart.launch.agent_chaos import AgentChaos
    from stalwart.launch.chaos_actions import newest_committed
    from stalwart.launch.clock import ManualClock
    from stalwart.launch.fakes import RecordingLedger
    from stalwart.launch.progress import ProgressTracker
    from stalwart.protocol import StepDone
    from stalwart.protocol.run_dir import RunDir

    run, mem = RunDir(tmp_path / "run"), tmp_path / "mem"
    _version(run.checkpoints, 8)
    _version(mem, 8)
    _version(mem, 12)  # committed in the memory tier first: the version a restart reads
    _version(run.checkpoints, 12, committed=False)  # still on its way to disk
    assert newest_committed(run.checkpoints, [mem]) == 12
    fault = parse_spec("corrupt-checkpoint@step=15,on=failure")
    ledger = RecordingLedger()
    chaos = AgentChaos(FaultPlan((fault,)), run, ledger, ManualClock(), _Memory(mem))
    tracker = ProgressTracker(ranks=[0], started=0.0)
    tracker.observe(StepDone(0, 20, 1.0, 0.1, {}), 1.1)
    chaos.tick(tracker)  # its step came and went: nothing yet, however long the run goes on
    assert not ledger.of(ChaosInjected)
    chaos.settle()  # the attempt failed and its workers are gone
    [hit] = ledger.of(ChaosInjected)
    assert "step-000000012" in hit.detail and "step-000000008" not in hit.detail
    assert hit.detail.startswith("memory tier: ")  # only the memory tier had committed 12
    assert (mem / "step-000000012" / "__0_0.distcp").read_bytes() != bytes(range(256)) * 8
    chaos.settle()  # once per run
    assert len(ledger.of(ChaosInjected)) == 1


def test_on_failure_is_only_for_checkpoint_damage_and_only_failure():
    from stalwart.chaos.plan import parse_spec
    from stalwart.errors import FaultPlanError

    assert parse_spec("truncate-checkpoint@step=3,on=failure").on_failure
    assert "first failure" in parse_spec("truncate-checkpoint@step=3,on=failure").describe()
    with pytest.raises(FaultPlanError, match="takes no on="):
        parse_spec("crash@rank=0,step=3,on=failure")
    with pytest.raises(FaultPlanError, match="use on=failure"):
        parse_spec("corrupt-checkpoint@step=3,on=success")


def test_each_damaged_copy_is_named_by_its_tier(tmp_path):
    """The disk and the memory copy of one version flip the same bytes of the same file name: only
    the tier tells the two lines of the console apart."""
    from stalwart.chaos.plan import FaultPlan, parse_spec
    from stalwart.events import ChaosInjected
    from stalwart.launch.agent_chaos import AgentChaos
    from stalwart.launch.clock import ManualClock
    from stalwart.launch.fakes import RecordingLedger
    from stalwart.launch.progress import ProgressTracker
    from stalwart.protocol import StepDone
    from stalwart.protocol.run_dir import RunDir

    run, mem = RunDir(tmp_path / "run"), tmp_path / "mem"
    _version(run.checkpoints, 10)
    _version(mem, 10)
    ledger = RecordingLedger()
    chaos = AgentChaos(
        FaultPlan((parse_spec("corrupt-checkpoint@step=14"),)), run, ledger, ManualClock(), _Memory(mem)
    )
    tracker = ProgressTracker(ranks=[0], started=0.0)
    tracker.observe(StepDone(0, 13, 1.0, 0.1, {}), 1.1)
    chaos.tick(tracker)
    [hit] = ledger.of(ChaosInjected)
    on_disk, in_memory = hit.detail.split("; ")
    assert on_disk.startswith("local tier: flipped 16 bytes at offset 1024 of step-000000010/__0_0.distcp")
    assert in_memory.startswith("memory tier: flipped 16 bytes at offset 1024 of step-000000010/")
