"""Agent-side checkpoint damage: which version it hits, and when it must wait."""

from __future__ import annotations

from pathlib import Path

from stalwart.checkpoint.manifest import MANIFEST
from stalwart.launch.chaos_actions import damage, newest_checkpoint, persist_in_flight


def _version(root: Path, step: int, *, committed: bool = True) -> Path:
    name = f"step-{step:09d}" if committed else f".step-{step:09d}.partial"
    d = root / name
    d.mkdir(parents=True)
    (d / "__0_0.distcp").write_bytes(bytes(range(256)) * 8)
    if committed:
        (d / MANIFEST).write_text("{}")
    return d


def test_a_newer_version_on_its_way_holds_the_damage_back(tmp_path):
    disk, mem = tmp_path / "disk", tmp_path / "mem"
    _version(disk, 8)
    _version(mem, 8)
    assert not persist_in_flight(disk, [mem, tmp_path / "absent"])  # a missing root holds nothing
    _version(mem, 12, committed=False)  # the memory tier is written first
    assert persist_in_flight(disk, [mem])
    (mem / ".step-000000012.partial").rename(mem / "step-000000012")
    (mem / "step-000000012" / MANIFEST).write_text("{}")
    assert persist_in_flight(disk, [mem])  # committed in memory: the disk commit is still to come
    _version(disk, 12, committed=False)
    assert persist_in_flight(disk, [mem])
    (disk / ".step-000000012.partial").rename(disk / "step-000000012")
    (disk / "step-000000012" / MANIFEST).write_text("{}")
    assert not persist_in_flight(disk, [mem])
    _version(disk, 4, committed=False)  # a leftover partial older than the newest commit
    assert not persist_in_flight(disk, [mem])


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
