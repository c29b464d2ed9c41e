"""Nothing executes from a checkpoint, and tier directories are private.

A crafted pickle (a ``__reduce__`` that would run a shell command creating a marker file) is put
where DCP would unpickle it; the tests check the refusal names the global and the marker file
does not appear."""

import os
import pickle
import stat

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from stalwart.checkpoint.engine import CheckpointEngine
from stalwart.checkpoint.safe_reader import (
    SafeFileSystemReader,
    SafeLoad,
    UnsafeCheckpoint,
    check_metadata_file,
    load_metadata,
    refused,
    safe_load_kwargs,
)
from stalwart.checkpoint.store import FileStore
from stalwart.checkpoint.tiers import TierConfig, default_shm_root, private_dir
from stalwart.errors import CheckpointError

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


class Evil:
    """Unpickling this runs ``touch <marker>``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture
def marker(tmp_path):
    m = tmp_path / "PWNED"
    yield m
    assert not m.exists(), "a pickle from the checkpoint ran code"


def _two_tensors():
    return {"a": torch.randn(3, 2), "b": torch.arange(4, dtype=torch.int64)}


def test_real_metadata_of_a_two_tensor_state_loads(tmp_path):
    state = _two_tensors()
    dcp.save(state, checkpoint_id=str(tmp_path))
    assert check_metadata_file(tmp_path / ".metadata") == ""
    target = {k: torch.zeros_like(v) for k, v in state.items()}
    dcp.load(target, **safe_load_kwargs(tmp_path))
    assert all(torch.equal(target[k], state[k]) for k in state)


def test_real_metadata_of_a_model_with_adam_and_plain_values_loads(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    state = {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "extra": {"epoch": 3, "tags": ["a", 1.5]},
    }
    dcp.save(state, checkpoint_id=str(tmp_path))
    assert check_metadata_file(tmp_path / ".metadata") == ""
    target = {
        "model": {k: torch.zeros_like(v) for k, v in model.state_dict().items()},
        "optim": opt.state_dict(),
        "extra": {"epoch": 0, "tags": []},
    }
    dcp.load(target, **safe_load_kwargs(tmp_path))
    assert target["extra"] == {"epoch": 3, "tags": ["a", 1.5]}  # non-tensor values through weights_only
    assert all(torch.equal(target["model"][k], v) for k, v in model.state_dict().items())


@pytest.fixture
def one_rank_group():
    """An in-process gloo group of one rank (a HashStore: no sockets, no processes)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_real_metadata_of_a_dtensor_state_loads(tmp_path, one_rank_group):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (1,))
    state = {
        "w": distribute_tensor(torch.randn(4, 4), mesh, [Shard(0)]),
        "r": distribute_tensor(torch.randn(4), mesh, [Replicate()]),
        "bf": torch.randn(3, dtype=torch.bfloat16),
        "flags": torch.ones(2, dtype=torch.bool),
    }
    dcp.save(state, checkpoint_id=str(tmp_path))
    assert check_metadata_file(tmp_path / ".metadata") == ""
    target = {k: torch.zeros_like(v) for k, v in state.items()}
    dcp.load(target, **safe_load_kwargs(tmp_path))
    assert all(
        torch.equal(
            target[k].full_tensor() if hasattr(target[k], "full_tensor") else target[k],
            v.full_tensor() if hasattr(v, "full_tensor") else v,
        )
        for k, v in state.items()
    )


def test_crafted_metadata_is_refused_by_name_without_running(tmp_path, marker):
    dcp.save(_two_tensors(), checkpoint_id=str(tmp_path))
    (tmp_path / ".metadata").write_bytes(pickle.dumps(Evil(marker)))
    reason = check_metadata_file(tmp_path / ".metadata")
    assert "posix.system" in reason or "nt.system" in reason
    with pytest.raises(UnsafeCheckpoint, match="system"):
        SafeFileSystemReader(tmp_path).read_metadata()
    safe = SafeLoad(tmp_path)
    with pytest.raises(CheckpointException) as err:  # what dcp.load itself does with it
        dcp.load({"a": torch.zeros(3, 2)}, **safe.kwargs)
    assert "system" in safe.refused(err.value) and "refused without running it" in safe.refused(err.value)


def test_crafted_metadata_hidden_inside_real_metadata_is_refused(tmp_path, marker):
    dcp.save(_two_tensors(), checkpoint_id=str(tmp_path))
    meta = SafeFileSystemReader(tmp_path).read_metadata()
    meta.planner_data = {"x": Evil(marker)}  # a legitimate Metadata carrying a payload in a field
    assert "system" in check_metadata_file_bytes(pickle.dumps(meta))


def check_metadata_file_bytes(data):
    try:
        load_metadata(data)
    except UnsafeCheckpoint as exc:
        return exc.message
    return ""


@pytest.mark.parametrize(
    "payload,why",
    [
        (b"", "does not unpickle"),
        (b"\x80\x05garbage", "does not unpickle"),
        (pickle.dumps({"not": "metadata"}), "not DCP Metadata"),
    ],
)
def test_metadata_that_is_not_metadata_is_refused(payload, why):
    assert why in check_metadata_file_bytes(payload)


def test_crafted_non_tensor_value_is_refused_without_running(tmp_path, marker):
    dcp.save({"t": torch.ones(2), "obj": Evil(marker)}, checkpoint_id=str(tmp_path))  # pickling runs nothing
    assert check_metadata_file(tmp_path / ".metadata") == ""  # the metadata itself is clean
    with pytest.raises(CheckpointException) as err:
        dcp.load({"t": torch.zeros(2), "obj": None}, **safe_load_kwargs(tmp_path))
    assert "obj" in refused(err.value) and "weights_only" in refused(err.value)


def test_refused_ignores_ordinary_load_errors():
    assert refused(RuntimeError("size mismatch")) == ""
    assert refused(CheckpointException("load", {0: (KeyError("model.w"), None)})) == ""
    assert "planted" not in refused(pickle.UnpicklingError("Weights only load failed"))
    assert refused(pickle.UnpicklingError("Weights only load failed")).startswith("a tensor file was refused")


# --- private tier directories ------------------------------------------------------------------


def test_private_dir_creates_it_and_missing_parents_0700_whatever_the_umask(tmp_path):
    old = os.umask(0o002)
    try:
        d = private_dir(tmp_path / "a" / "tier")
    finally:
        os.umask(old)
    assert stat.S_IMODE(d.stat().st_mode) == 0o700 and stat.S_IMODE(d.parent.stat().st_mode) == 0o700


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_a_group_or_world_writable_tier_root_is_refused(tmp_path, mode):
    root = tmp_path / "shm"
    root.mkdir()
    os.chmod(root, mode)
    with pytest.raises(CheckpointError, match="writable by group or others") as err:
        FileStore(root)
    assert "chmod go-w" in err.value.hint


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_a_tier_root_owned_by_another_user_is_refused(tmp_path):
    root = tmp_path / "shm"
    root.mkdir(mode=0o700)
    os.chown(root, 12345, 12345)
    with pytest.raises(CheckpointError, match="owned by uid 12345") as err:
        CheckpointEngine([TierConfig(name="mem", kind="memory", location=str(root))])
    assert "choose another checkpoint location" in err.value.hint


def test_a_tier_root_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(CheckpointError, match="not a directory"):
        FileStore(tmp_path / "f")


def test_a_root_made_unsafe_after_start_fails_that_tier_and_keeps_the_others(tmp_path):
    tiers = [
        TierConfig(name="mem", kind="memory", location=str(tmp_path / "shm")),
        TierConfig(name="disk", kind="local", location=str(tmp_path / "disk")),
    ]
    eng = CheckpointEngine(tiers)
    (tmp_path / "shm").mkdir()
    os.chmod(tmp_path / "shm", 0o777)  # planted between start-up and the first save
    res = eng.save(1, {"w": torch.ones(2)}).future.result()
    eng.close()
    assert res.committed == ("disk",)
    assert "writable by group or others" in res.commits[0].reason
    assert not any((tmp_path / "shm").iterdir())


def test_default_memory_root_is_per_user_directly_in_the_tmpfs(monkeypatch, tmp_path):
    monkeypatch.setenv("STALWART_SHM_DIR", str(tmp_path))
    root = default_shm_root("job7")
    assert root.parent == tmp_path and root.name == f"stalwart-{os.geteuid()}-job7"


# --- the key on every path: object tier, retention ----------------------------------------------

KEY = "0123456789abcdef0123456789abcdef"


def test_object_tier_with_a_key_refuses_a_forged_manifest_and_fetches_none_of_its_files(
    tmp_path, monkeypatch
):
    import json

    import fsspec

    monkeypatch.setenv("STALWART_CHECKPOINT_KEY", KEY)
    base = f"/stalwart-sec-{tmp_path.name}/c"
    eng = CheckpointEngine(
        [TierConfig(name="obj", kind="object", location=f"memory://{base}", keep=3)],
        fetch_dir=str(tmp_path / "f"),
    )
    for step in (1, 2):
        eng.save(step, {"w": torch.full((4,), float(step))}).future.result()
    fs = fsspec.filesystem("memory")
    mpath = f"{base}/step-000000002/MANIFEST.json"
    doc = json.loads(fs.cat_file(mpath))
    doc["meta"]["bytes"] = 1  # any change, even outside the file list
    fs.pipe_file(mpath, json.dumps(doc).encode())
    target = {"w": torch.zeros(4)}
    got = eng.load_latest(target)
    eng.close()
    assert got.step == 1 and torch.equal(target["w"], torch.full((4,), 1.0))
    assert "MAC does not match" in got.rejected[0]
    fetched = tmp_path / "f" / ".fetch" / "obj" / "step-000000002"
    assert sorted(p.name for p in fetched.iterdir()) == ["MANIFEST.json"]
    fs.rm(f"/stalwart-sec-{tmp_path.name}", recursive=True)


def test_with_a_key_planted_versions_do_not_push_real_ones_out_of_retention(tmp_path, monkeypatch):
    import shutil

    from stalwart.checkpoint.persist import retain_files

    monkeypatch.setenv("STALWART_CHECKPOINT_KEY", KEY)
    eng = CheckpointEngine([TierConfig(name="disk", kind="local", location=str(tmp_path / "d"), keep=2)])
    for step in (1, 2):
        eng.save(step, {"w": torch.ones(2)}).future.result()
    eng.close()
    store = FileStore(tmp_path / "d")
    for step in (3, 4, 5):  # copies with the manifest re-signed by someone without the key
        planted = store.final(step)
        shutil.copytree(store.final(2), planted)
        text = (planted / "MANIFEST.json").read_text().replace('"step": 2', f'"step": {step}')
        (planted / "MANIFEST.json").write_text(text)
    retain_files(store, keep=2)
    assert [s for s, _ in store.versions()] == [5, 4, 3, 2, 1]  # nothing real was deleted


@pytest.mark.parametrize(
    "module,name",
    [
        ("torch", "load"),
        ("torch", "_inductor"),
        ("builtins", "eval"),
        ("torch.distributed.checkpoint.filesystem", "FileSystemReader"),
    ],
)
def test_globals_outside_the_allow_list_are_refused_by_name(module, name):
    data = b"\x80\x04c" + f"{module}\n{name}\n".encode() + b"."  # protocol 4: GLOBAL then STOP
    assert f"global {module}.{name}" in check_metadata_file_bytes(data)


def test_dtypes_and_sizes_are_allowed():
    import io

    from stalwart.checkpoint.safe_reader import RestrictedUnpickler

    data = pickle.dumps([torch.bfloat16, torch.bool, torch.Size([2, 3])])
    assert RestrictedUnpickler(io.BytesIO(data)).load() == [torch.bfloat16, torch.bool, torch.Size([2, 3])]


def test_a_run_directory_made_under_umask_002_gives_a_private_checkpoint_dir(tmp_path):
    from stalwart.protocol.run_dir import RunDir

    old = os.umask(0o002)
    try:
        rd = RunDir(tmp_path / "run").create()
    finally:
        os.umask(old)
    assert stat.S_IMODE(rd.checkpoints.stat().st_mode) == 0o700
    FileStore(rd.checkpoints)  # accepted


def test_a_crafted_pt_file_is_refused_in_one_line_and_a_plain_one_loads(tmp_path, marker):
    from stalwart.checkpoint.safe_reader import load_torch_file

    torch.save({"rng": torch.get_rng_state(), "pos": 17}, tmp_path / "rank-0.pt")
    assert load_torch_file(tmp_path / "rank-0.pt")["pos"] == 17
    torch.save({"rng": torch.get_rng_state(), "x": Evil(marker)}, tmp_path / "rank-1.pt")
    with pytest.raises(UnsafeCheckpoint) as err:
        load_torch_file(tmp_path / "rank-1.pt")
    assert "rank-1.pt was refused" in err.value.message and "posix.system" in err.value.message
    assert "\n" not in err.value.message


def test_with_a_key_planted_object_versions_do_not_push_real_ones_out(tmp_path, monkeypatch):
    import fsspec

    from stalwart.checkpoint.persist import retain_object
    from stalwart.checkpoint.store import FsspecStore

    monkeypatch.setenv("STALWART_CHECKPOINT_KEY", KEY)
    base = f"/stalwart-ret-{tmp_path.name}/c"
    eng = CheckpointEngine(
        [TierConfig(name="obj", kind="object", location=f"memory://{base}", keep=2)],
        fetch_dir=str(tmp_path / "f"),
    )
    for step in (1, 2):
        eng.save(step, {"w": torch.ones(2)}).future.result()
    eng.close()
    fs = fsspec.filesystem("memory")
    for step in (3, 4):  # unsigned manifests: anyone with write access to the bucket can put these
        manifest = fs.cat_file(f"{base}/step-000000002/MANIFEST.json").replace(
            b'"step": 2', f'"step": {step}'.encode()
        )
        fs.pipe_file(f"{base}/step-00000000{step}/MANIFEST.json", manifest)
    store = FsspecStore(f"memory://{base}")
    retain_object(store, keep=2)
    assert [s for s, _ in store.versions()] == [4, 3, 2, 1]
    fs.rm(f"/stalwart-ret-{tmp_path.name}", recursive=True)


class Point:  # an ordinary user object: only a full unpickle could read it back
    def __init__(self, x):
        self.x = x


def test_a_state_value_that_would_be_refused_on_load_fails_the_save_not_the_resume(tmp_path):
    from stalwart.checkpoint.manifest import verify

    eng = CheckpointEngine([TierConfig(name="disk", kind="local", location=str(tmp_path / "d"), keep=5)])
    eng.save(1, {"w": torch.ones(2), "epoch": 1, "sched": {"lr": [0.1, 0.01]}}).future.result()
    res = eng.save(2, {"w": torch.ones(2), "epoch": 2, "sched": {"best": Point(1.5)}}).future.result()
    eng.close()
    assert res.committed == ()
    assert "state value sched.best would not load back safely" in res.commits[0].reason
    assert "Point" in res.commits[0].reason
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["step-000000001"]  # no partial left
    assert verify(tmp_path / "d" / "step-000000001")[0] is not None


def test_a_step_the_manifest_cannot_hold_fails_that_save_with_a_reason(tmp_path):
    eng = CheckpointEngine([TierConfig(name="disk", kind="local", location=str(tmp_path / "d"))])
    res = eng.save(10**9, {"w": torch.ones(2)}).future.result()  # more than the 9 digits of step-<N>
    eng.close()
    assert (
        res.committed == () and "commit failed" in res.commits[0].reason and "\n" not in res.commits[0].reason
    )
    assert list((tmp_path / "d").iterdir()) == []


def test_a_committed_step_directory_is_0700_whatever_the_umask(tmp_path):
    from stalwart.checkpoint.manifest import Manifest

    store = FileStore(tmp_path / "ckpt", fsync=False, key=b"")
    old = os.umask(0o022)
    try:
        work = store.begin(5)
        (work / "data").write_bytes(b"x")
        final = store.commit(5, Manifest(step=5, world_size=1, files={}, created=1.0))
    finally:
        os.umask(old)
    assert stat.S_IMODE(work.parent.stat().st_mode) == 0o700
    assert final.name == "step-000000005" and stat.S_IMODE(final.stat().st_mode) == 0o700
