import errno
import threading

import fsspec
import pytest
import torch
import torch.distributed.checkpoint as dcp

from stalwart.checkpoint.engine import CheckpointEngine
from stalwart.checkpoint.manifest import verify
from stalwart.checkpoint.tiers import TierConfig
from stalwart.errors import CheckpointError
from stalwart.events import CheckpointCommitted, CheckpointLoaded, CheckpointRejected, CheckpointStaged
from stalwart.events.checkpoint import CheckpointPersistFailed, EmergencyCheckpoint

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _state(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "model": {"w": torch.randn(128, 64, generator=g), "b": torch.randn(64, generator=g)},
        "optim": {"m": torch.randn(128, 64, generator=g), "step": torch.tensor(3.0)},
        "epoch": 2,
    }


def _zeros_like(state):
    return {
        "model": {k: torch.zeros_like(v) for k, v in state["model"].items()},
        "optim": {k: torch.zeros_like(v) for k, v in state["optim"].items()},
        "epoch": 0,
    }


def _equal(a, b):
    return (
        all(torch.equal(a[g][k], b[g][k]) for g in ("model", "optim") for k in a[g])
        and a["epoch"] == b["epoch"]
    )


def _clone(state):
    return {
        g: ({k: v.clone() for k, v in state[g].items()} if isinstance(state[g], dict) else state[g])
        for g in state
    }


@pytest.fixture
def tiers(tmp_path):
    return [
        TierConfig(name="mem", kind="memory", location=str(tmp_path / "shm"), keep=2),
        TierConfig(name="disk", kind="local", location=str(tmp_path / "disk"), every_steps=2, keep=2),
    ]


def _engine(tiers, events=None, **kw):
    return CheckpointEngine(tiers, sink=(events.append if events is not None else None), **kw)


def test_round_trip_is_exact_and_rank_state_comes_back(tiers):
    events = []
    eng = _engine(tiers, events)
    state = _state()
    ticket = eng.save(4, state, {"rng": torch.get_rng_state(), "pos": 17})
    assert ticket.tiers == ("mem", "disk") and ticket.stall_s >= 0
    res = ticket.future.result()
    assert res.committed == ("mem", "disk")
    target = _zeros_like(state)
    got = eng.load_latest(target)
    eng.close()
    assert got.step == 4 and got.tier == "mem" and got.world_size == 1
    assert _equal(target, state)
    assert torch.equal(got.rank_state["rng"], torch.get_rng_state()) and got.rank_state["pos"] == 17
    kinds = [type(e) for e in events]
    assert kinds.count(CheckpointStaged) == 1 and kinds.count(CheckpointCommitted) == 2
    commits = [e for e in events if isinstance(e, CheckpointCommitted)]
    assert commits[0].stall_s == ticket.stall_s and commits[1].stall_s == 0.0  # stall counted once
    assert isinstance(events[-1], CheckpointLoaded)


def test_mutating_right_after_save_returns_does_not_change_the_checkpoint(tiers):
    eng = _engine(tiers)
    state = _state()
    before = _clone(state)
    ticket = eng.save(1, state)
    for v in state["model"].values():  # training goes on while the persist runs
        v.mul_(-3.0).add_(1.0)
    state["optim"]["m"].zero_()
    ticket.future.result()
    target = _zeros_like(state)
    eng.load_latest(target)
    eng.close()
    assert _equal(target, before)
    assert not torch.equal(target["model"]["w"], state["model"]["w"])


def test_tier_intervals_and_retention(tiers, tmp_path):
    eng = _engine(tiers)
    state = _state()
    done = {}
    for step in range(1, 8):
        t = eng.save(step, state)
        done[step] = t.tiers
        eng.wait()
    eng.close()
    assert done[1] == ("mem", "disk") and done[2] == ("mem",) and done[3] == ("mem", "disk")
    assert sorted(p.name for p in (tmp_path / "shm").iterdir()) == ["step-000000006", "step-000000007"]
    assert sorted(p.name for p in (tmp_path / "disk").iterdir()) == ["step-000000005", "step-000000007"]


def test_busy_persist_makes_save_skip_without_stalling(tiers):
    gate = threading.Event()

    def slow_writer(path, tier):
        gate.wait(30)
        return dcp.FileSystemWriter(path, sync_files=False)

    eng = _engine(tiers, writer_factory=slow_writer)
    state = _state()
    first = eng.save(1, state)
    second = eng.save(2, state)
    assert second.future is None and "still running" in second.skipped
    gate.set()
    assert first.future.result().committed == ("mem", "disk")
    eng.close()


def _corrupt_newest_then_load(tiers, tmp_path, damage):
    events = []
    eng = _engine(tiers, events)
    s1, s2 = _state(1), _state(2)
    eng.save(1, s1).future.result()
    eng.save(3, s2).future.result()
    for tier in ("shm", "disk"):
        damage(tmp_path / tier / "step-000000003")
    target = _zeros_like(s1)
    got = eng.load_latest(target)
    eng.close()
    rejected = [e for e in events if isinstance(e, CheckpointRejected)]
    return got, target, s1, rejected


def _data_file(d):
    return next(p for p in d.iterdir() if p.suffix == ".distcp")


def test_flipped_bit_falls_back_to_the_previous_good_version(tiers, tmp_path):
    def flip(d):
        f = _data_file(d)
        raw = bytearray(f.read_bytes())
        raw[len(raw) // 2] ^= 0x10
        f.write_bytes(bytes(raw))

    got, target, s1, rejected = _corrupt_newest_then_load(tiers, tmp_path, flip)
    assert got.step == 1 and _equal(target, s1)
    assert len(rejected) == 2 and all("corrupted" in e.reason and e.step == 3 for e in rejected)
    assert got.rejected and "checksum" in got.rejected[0]


def test_truncated_file_falls_back(tiers, tmp_path):
    def truncate(d):
        f = _data_file(d)
        f.write_bytes(f.read_bytes()[:100])

    got, target, s1, rejected = _corrupt_newest_then_load(tiers, tmp_path, truncate)
    assert got.step == 1 and _equal(target, s1)
    assert all("truncated" in e.reason for e in rejected)


def test_missing_shard_falls_back(tiers, tmp_path):
    got, target, s1, rejected = _corrupt_newest_then_load(tiers, tmp_path, lambda d: _data_file(d).unlink())
    assert got.step == 1 and _equal(target, s1)
    assert all("missing file" in e.reason for e in rejected)


def test_missing_manifest_is_never_loaded(tiers, tmp_path):
    got, target, s1, rejected = _corrupt_newest_then_load(
        tiers, tmp_path, lambda d: (d / "MANIFEST.json").unlink()
    )
    assert got.step == 1 and _equal(target, s1)
    assert all("no manifest" in e.reason for e in rejected)


def test_newest_step_wins_over_a_faster_tier_with_an_older_one(tiers, tmp_path):
    eng = _engine(tiers)
    s1, s2 = _state(1), _state(2)
    eng.save(1, s1).future.result()
    eng.save(3, s2).future.result()
    import shutil

    shutil.rmtree(tmp_path / "shm" / "step-000000003")
    target = _zeros_like(s1)
    got = eng.load_latest(target)
    eng.close()
    assert (got.step, got.tier) == (3, "disk") and _equal(target, s2)


def test_full_disk_commits_nothing_and_keeps_older_versions(tiers, tmp_path):
    fail = {"on": False}

    class FullDiskWriter(dcp.FileSystemWriter):
        def write_data(self, plan, planner):
            if fail["on"]:
                raise OSError(errno.ENOSPC, "No space left on device")
            return super().write_data(plan, planner)

    events = []
    eng = _engine(tiers, events, writer_factory=lambda p, t: FullDiskWriter(p, sync_files=False))
    s1 = _state(1)
    eng.save(1, s1).future.result()
    fail["on"] = True
    res = eng.save(3, _state(2)).future.result()
    assert res.committed == ()
    failed = [e for e in events if isinstance(e, CheckpointPersistFailed)]
    assert {e.tier for e in failed} == {"mem", "disk"} and all("No space" in e.reason for e in failed)
    assert not any(p.name.endswith(".partial") for p in (tmp_path / "disk").iterdir())
    assert verify(tmp_path / "disk" / "step-000000001")[0] is not None
    target = _zeros_like(s1)
    got = eng.load_latest(target)
    eng.close()
    assert got.step == 1 and _equal(target, s1)


def test_object_tier_through_fsspec_and_fallback_to_it(tmp_path):
    url = f"memory://stalwart-test-{tmp_path.name}/ckpt"
    tiers = [
        TierConfig(name="disk", kind="local", location=str(tmp_path / "disk")),
        TierConfig(name="obj", kind="object", location=url, every_steps=2, keep=1),
    ]
    events = []
    eng = _engine(tiers, events)
    states = {s: _state(s) for s in (1, 2, 3)}
    for s in (1, 2, 3):
        eng.save(s, states[s]).future.result()
    fs = fsspec.filesystem("memory")
    listed = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"/stalwart-test-{tmp_path.name}/ckpt", detail=False))
    assert listed == ["step-000000003"]  # keep=1 on the object tier
    import shutil

    shutil.rmtree(tmp_path / "disk")  # node lost: only the object store remains
    target = _zeros_like(states[1])
    got = eng.load_latest(target)
    assert (got.step, got.tier) == (3, "obj") and _equal(target, states[3])
    # a flipped bit in the object store is caught as well
    data = next(
        p
        for p in fs.ls(f"/stalwart-test-{tmp_path.name}/ckpt/step-000000003", detail=False)
        if p.endswith(".distcp")
    )
    raw = bytearray(fs.cat_file(data))
    raw[10] ^= 1
    fs.pipe_file(data, bytes(raw))
    assert eng.load_latest(_zeros_like(states[1])) is None
    eng.close()
    assert any(isinstance(e, CheckpointRejected) and "obj" in e.reason for e in events)
    fs.rm(f"/stalwart-test-{tmp_path.name}", recursive=True)


def test_object_tier_alone_writes_through_a_scratch_copy(tmp_path):
    url = f"memory://stalwart-alone-{tmp_path.name}/c"
    eng = _engine([TierConfig(name="obj", kind="object", location=url)], fetch_dir=str(tmp_path / "f"))
    s = _state(5)
    assert eng.save(1, s).future.result().committed == ("obj",)
    target = _zeros_like(s)
    assert eng.load_latest(target).step == 1 and _equal(target, s)
    eng.close()
    fsspec.filesystem("memory").rm(f"/stalwart-alone-{tmp_path.name}", recursive=True)


def test_emergency_persists_the_newest_staged_state_to_a_durable_tier(tmp_path):
    tiers = [
        TierConfig(name="mem", kind="memory", location=str(tmp_path / "shm")),
        TierConfig(name="disk", kind="local", location=str(tmp_path / "disk"), every_steps=100),
    ]
    events = []
    eng = _engine(tiers, events)
    eng.save(1, _state(1)).future.result()
    s = _state(9)
    eng.save(5, s).future.result()  # memory only
    assert not (tmp_path / "disk" / "step-000000005").exists()
    res = eng.emergency_persist(deadline_s=30.0)
    assert res.committed and res.step == 5 and res.tier == "disk" and res.duration_s <= 30.0
    manifest, _ = verify(tmp_path / "disk" / "step-000000005")
    assert manifest.meta["emergency"] is True
    again = eng.emergency_persist(deadline_s=30.0)
    assert again.committed and "already durable" in again.reason
    eng.close()
    assert [e.committed for e in events if isinstance(e, EmergencyCheckpoint)] == [True, True]


def test_emergency_reports_a_missed_deadline(tmp_path):
    gate = threading.Event()

    def blocked(path, tier):
        if tier.name == "disk":
            gate.wait(30)
        return dcp.FileSystemWriter(path, sync_files=False)

    ticks = iter(range(1000))
    tiers = [
        TierConfig(name="mem", kind="memory", location=str(tmp_path / "shm")),
        TierConfig(name="disk", kind="local", location=str(tmp_path / "disk"), every_steps=100),
    ]
    eng = CheckpointEngine(tiers, writer_factory=blocked, clock=lambda: float(next(ticks)))
    eng.save(0, _state(1), force=False)
    gate.set()
    eng.wait()
    gate.clear()
    eng.save(5, _state(2)).future.result()
    res = eng.emergency_persist(deadline_s=0.5)
    assert not res.committed and "deadline" in res.reason
    gate.set()
    eng.close()
    assert verify(tmp_path / "disk" / "step-000000005")[0] is not None  # it finished after all


def test_no_snapshot_means_no_emergency_commit(tiers):
    eng = _engine(tiers)
    res = eng.emergency_persist(1.0)
    eng.close()
    assert not res.committed and "no consistent staged snapshot" in res.reason and res.step == -1


def test_stage_while_persisting_is_refused(tiers):
    gate = threading.Event()
    eng = _engine(tiers, writer_factory=lambda p, t: (gate.wait(30), dcp.FileSystemWriter(p))[1])
    eng.save(1, _state())
    with pytest.raises(CheckpointError, match="staging buffers"):
        eng.stage(2, _state())
    gate.set()
    eng.close()


def test_crash_leftovers_are_swept_and_never_listed(tiers, tmp_path):
    eng = _engine(tiers)
    eng.save(1, _state()).future.result()
    eng.close()
    torn = tmp_path / "disk" / ".step-000000002.partial"
    torn.mkdir()
    (torn / "__0_0.distcp").write_bytes(b"half")
    eng2 = _engine(tiers)
    assert not torn.exists()
    assert [s for s, _, _ in eng2.candidates()] == [1, 1]
    eng2.close()


def test_signal_during_staging_copies_the_newest_memory_version_to_disk(tmp_path):
    from stalwart.checkpoint.staging import Stager

    class Interrupted(Stager):
        calls = 0

        def stage(self, step, state, rank_state=None):
            Interrupted.calls += 1
            if Interrupted.calls == 3:  # the signal handler runs while the buffers are half-written
                raise KeyboardInterrupt
            return super().stage(step, state, rank_state)

    tiers = [
        TierConfig(name="mem", kind="memory", location=str(tmp_path / "shm")),
        TierConfig(name="disk", kind="local", location=str(tmp_path / "disk"), every_steps=100),
    ]
    eng = CheckpointEngine(tiers, stager=Interrupted(pin=False))
    eng.save(1, _state(1)).future.result()
    s4 = _state(4)
    eng.save(4, s4).future.result()
    with pytest.raises(KeyboardInterrupt):
        eng.save(6, _state(6))
    res = eng.emergency_persist(30.0)
    assert res.committed and res.step == 4 and res.tier == "disk" and "while staging" in res.reason
    manifest, _ = verify(tmp_path / "disk" / "step-000000004")
    assert manifest.meta["emergency"] is True
    import shutil

    shutil.rmtree(tmp_path / "shm")
    target = _zeros_like(s4)
    got = eng.load_latest(target)
    eng.close()
    assert (got.step, got.tier) == (4, "disk") and _equal(target, s4)


def test_a_target_that_does_not_fit_is_a_clear_error(tiers):
    eng = _engine(tiers)
    eng.save(1, _state()).future.result()
    with pytest.raises(CheckpointError, match="does not fit the state to load"):
        eng.load_latest({"model": {"other": torch.zeros(3)}})
    eng.close()
