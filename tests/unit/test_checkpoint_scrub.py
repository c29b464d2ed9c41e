"""Background checkpoint verification, agent side (launch/checkpoint_scrub.py) over versions written
as the engine lays them out (a manifest with each file's size and SHA-256), on a manual clock."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from stalwart.checkpoint.manifest import MANIFEST, FileEntry, Manifest, encode
from stalwart.checkpoint.scrub import read_version
from stalwart.checkpoint.store import committed_versions, step_name
from stalwart.events import Event
from stalwart.events.checkpoint import CheckpointDamaged
from stalwart.launch.checkpoint_scrub import CheckpointScrub, ScrubTier
from stalwart.ledger import LedgerWriter, read_merged
from stalwart.policy.checkpoint_scrub import Budget
from stalwart.protocol.run_dir import RunDir


def version(
    root: Path, step: int, files: dict[str, bytes], *, listed: dict[str, bytes] | None = None
) -> Path:
    """A committed version holding ``files``; its manifest lists ``listed`` (default: the same)."""
    d = root / step_name(step)
    d.mkdir(parents=True)
    for name, body in files.items():
        (d / name).write_bytes(body)
    entries = {
        n: FileEntry(size=len(b), sha256=hashlib.sha256(b).hexdigest()) for n, b in (listed or files).items()
    }
    (d / MANIFEST).write_bytes(encode(Manifest(step=step, world_size=2, files=entries, created=1.0), None))
    return d


def flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def scrubber(
    tmp_path: Path, tiers, events: list[Event], clock: Clock, settle=lambda: None
) -> CheckpointScrub:
    return CheckpointScrub(
        tiers,
        run=RunDir(tmp_path / "run"),
        node="n1",
        run_id="r1",
        notify=events.append,
        budget=Budget(duty=1.0, recheck_s=5.0),
        wall=lambda: 1.7e9,
        mono=clock,
        cpu=lambda: 0.0,  # readings cost no CPU: the budget never makes the tests wait
        settle=settle,
        key=None,
    )


def seen_then_due(s: CheckpointScrub, clock: Clock) -> None:
    """One round that sees the versions committed (known good: their persist hashed them), then the
    clock past the recheck, when they are due."""
    s.poll()
    clock.t += 5.0


FILES = {"__0_0.distcp": b"a" * 4096, "__1_0.distcp": b"b" * 4096, "rank-0.pt": b"r0", ".metadata": b"m"}


def test_versions_are_read_a_recheck_after_their_commit_and_again_after_each_reading(tmp_path):
    disk = tmp_path / "disk"
    for step in (10, 20):
        version(disk, step, FILES)
    events: list[Event] = []
    clock = Clock()
    s = scrubber(tmp_path, [ScrubTier("local", disk, 1)], events, clock)
    s.poll()
    assert s.stats.readings == 0  # just committed: the persist hashed these very files
    clock.t += 5.0
    s.poll()
    s.poll()
    assert s.stats.readings == 2 and s.stats.bytes == 2 * sum(map(len, FILES.values()))
    s.poll()  # both verified within the recheck: nothing read
    assert s.stats.readings == 2
    clock.t += 5.0
    s.poll()
    assert s.stats.readings == 3 and not events


def test_a_damaged_version_is_set_aside_recorded_and_said(tmp_path):
    disk, mem = tmp_path / "disk", tmp_path / "mem"
    for step in (10, 20):
        version(disk, step, FILES)
    version(mem, 20, FILES)
    events: list[Event] = []
    clock = Clock()
    tiers = [ScrubTier("local", disk, 1), ScrubTier("memory", mem, 0, node_local=True)]
    s = scrubber(tmp_path, tiers, events, clock)
    seen_then_due(s, clock)
    for _ in range(3):
        s.poll()
    assert s.stats.readings == 3 and not events
    flip(disk / step_name(20) / "__1_0.distcp")  # damaged after it verified clean
    flip(mem / step_name(20) / "__1_0.distcp")
    clock.t += 5.0
    s.poll()  # the memory copy is due first; its damage has the fallbacks read at once
    assert s.stats.readings == 6
    assert [(e.tier, e.step) for e in events] == [("memory", 20), ("local", 20)]
    first, second = events
    assert isinstance(first, CheckpointDamaged) and isinstance(second, CheckpointDamaged)
    assert "__1_0.distcp checksum (SHA-256)" in first.reason and "(corrupted)" in first.reason
    assert (
        first.fallback
        == second.fallback
        == "a recovery reads step 10 from the local tier instead, verified just now"
    )
    assert second.set_aside == str(disk / ".step-000000020.damaged")
    assert [step for step, _ in committed_versions(disk)] == [10]  # no recovery or retention sees it
    assert committed_versions(mem) == []
    assert (disk / ".step-000000020.damaged" / "__1_0.distcp").is_file()  # kept for a look
    # in a ledger file of the scrubber's own
    assert [e.step for e in read_merged(tmp_path / "run") if isinstance(e, CheckpointDamaged)] == [20, 20]


def test_a_version_removed_while_it_is_read_is_not_called_damaged(tmp_path):
    disk = tmp_path / "disk"
    doomed = version(disk, 10, FILES)
    (doomed / "__1_0.distcp").unlink()  # retention's rmtree half way through ...
    events: list[Event] = []
    clock = Clock()
    s = scrubber(tmp_path, [ScrubTier("local", disk, 1)], events, clock, settle=lambda: shutil.rmtree(doomed))
    seen_then_due(s, clock)
    s.poll()  # ... and done by the time the problem is looked at again
    assert s.stats.readings == 1 and not events


def test_a_tier_another_node_reads_is_not_read_here_but_counts_for_the_fallback(tmp_path):
    disk, mem = tmp_path / "disk", tmp_path / "mem"
    version(disk, 10, FILES)
    version(mem, 10, FILES)
    flip(mem / step_name(10) / "__0_0.distcp")
    events: list[Event] = []
    tiers = [ScrubTier("local", disk, 1, verify=lambda: False), ScrubTier("memory", mem, 0, node_local=True)]
    clock = Clock()
    s = scrubber(tmp_path, tiers, events, clock)
    seen_then_due(s, clock)
    s.poll()
    s.poll()
    assert s.stats.readings == 1
    [ev] = events
    assert isinstance(ev, CheckpointDamaged) and ev.tier == "memory"
    assert ev.fallback == "a recovery reads step 10 from the local tier instead"


def test_a_node_local_version_is_checked_for_the_files_this_node_holds(tmp_path):
    here = {n: b for n, b in FILES.items() if n != "__1_0.distcp"}  # rank 1's shard is on the other node
    path = version(tmp_path / "mem", 10, here, listed=FILES)
    assert read_version(path, None, present_only=True).reading.problem == ""
    assert "missing file __1_0.distcp" in read_version(path, None, settle=lambda: None).reading.problem


def test_a_version_saved_again_under_its_step_is_a_new_commit(tmp_path):
    disk = tmp_path / "disk"
    version(disk, 10, FILES)
    clock = Clock()
    s = scrubber(tmp_path, [ScrubTier("local", disk, 1)], [], clock)
    seen_then_due(s, clock)
    s.poll()
    assert s.stats.readings == 1
    clock.t += 4.0
    shutil.rmtree(disk / step_name(10))
    version(disk, 10, {**FILES, "rank-1.pt": b"r1"})  # a restart saved step 10 again
    s.poll()  # seen committed now
    clock.t += 4.0
    s.poll()  # 8 s after the first reading, 4 s after the new commit: not due
    assert s.stats.readings == 1
    clock.t += 1.0
    s.poll()
    assert s.stats.readings == 2


def test_the_console_and_the_report_say_what_was_found_and_what_it_cost(tmp_path):
    import io

    from rich.console import Console
    from test_goodput import crash_run  # tests/unit is on sys.path (rootdir import mode)

    from stalwart.account.report import build, render
    from stalwart.launch.console import RunConsole

    run = RunDir(tmp_path / "run")
    run.ledger.mkdir(parents=True)
    w = LedgerWriter(run.agent_ledger("n0", 1), writer="test")
    for ev in crash_run():  # a run of 19 s
        w.append(ev)
    w.close()
    disk = tmp_path / "disk"
    version(disk, 10, FILES)
    flip(version(disk, 20, FILES) / "__1_0.distcp")
    events: list[Event] = []
    clock = Clock()
    s = scrubber(tmp_path, [ScrubTier("local", disk, 1)], events, clock)
    s.wall = lambda: 15.0
    seen_then_due(s, clock)
    s.poll()
    s.stop()  # records what it did

    live = io.StringIO()
    RunConsole(stream=live).event(events[0])
    said = " ".join(live.getvalue().split())
    assert "checkpoint damaged: step 20 in the local tier: __1_0.distcp checksum (SHA-256)" in said
    assert said.endswith(
        "(corrupted); set aside, a recovery reads step 10 from the local tier instead, verified just now"
    )

    rep = build(run.root)
    [found] = rep["checkpoints_damaged"]
    assert (found["tier"], found["step"]) == ("local", 20)
    assert found["set_aside"].endswith(".step-000000020.damaged")
    [cost] = rep["checkpoint_verification"]
    assert (
        cost["readings"] == 2 and cost["damaged"] == 1 and cost["bytes"] == 2 * sum(map(len, FILES.values()))
    )
    out = io.StringIO()
    render(rep, Console(file=out, width=80, highlight=False))
    text = " ".join(out.getvalue().split())
    assert "background checkpoint verification on n1: 2 versions read (0.0 MB) in" in text
    assert "checkpoints found damaged in the background and set aside: 1" in text
    assert "local tier, step 20: __1_0.distcp checksum" in text


def test_a_version_that_commits_while_a_damaged_one_is_read_is_the_fallback(tmp_path):
    disk = tmp_path / "disk"
    version(disk, 10, FILES)
    flip(version(disk, 20, FILES) / "__0_0.distcp")
    events: list[Event] = []
    clock = Clock()
    s = scrubber(
        tmp_path, [ScrubTier("local", disk, 1)], events, clock, settle=lambda: version(disk, 30, FILES)
    )
    seen_then_due(s, clock)
    s.poll()  # 20 is the newest when listed; 30 commits during the settle
    [ev] = events
    assert isinstance(ev, CheckpointDamaged) and ev.step == 20
    assert ev.fallback == "a recovery reads step 30 from the local tier instead, verified just now"
