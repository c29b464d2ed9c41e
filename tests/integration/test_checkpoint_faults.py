"""Fault cases on real files and real processes: kill -9 mid-persist, truncated file, flipped bit,
missing shard, full disk (a real 1 MiB tmpfs). Each run must resume from the newest good
checkpoint, with exactly its values, and every committed good version must still verify.

Run as a script, this file is a trainer process (see ``_main``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).resolve()
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def state_for(step: int, n: int = 20_000) -> dict:
    import torch

    g = torch.Generator().manual_seed(step)
    return {
        "model": {"w": torch.randn(n, generator=g), "b": torch.randn(64, generator=g)},
        "optim": {"m": torch.randn(n, generator=g)},
        "step": step,
    }


def _zeros(n: int = 20_000) -> dict:
    import torch

    return {"model": {"w": torch.zeros(n), "b": torch.zeros(64)}, "optim": {"m": torch.zeros(n)}, "step": -1}


def _tiers(root: Path, disk: Path | None = None, keep: int = 5):
    from stalwart.checkpoint.tiers import TierConfig

    return [
        TierConfig(name="mem", kind="memory", location=str(root / "shm"), keep=keep),
        TierConfig(name="disk", kind="local", location=str(disk or root / "disk"), keep=keep),
    ]


def _main(mode: str, root: str, arg: str) -> None:
    import torch
    import torch.distributed.checkpoint as dcp

    from stalwart.checkpoint.engine import CheckpointEngine

    root_p = Path(root)
    report: dict = {"events": []}

    def sink(ev):
        report["events"].append([type(ev).__name__, getattr(ev, "step", -1), getattr(ev, "reason", "")])

    if mode == "train":  # commit steps 1..arg on both tiers
        eng = CheckpointEngine(_tiers(root_p), sink=sink)
        for step in range(1, int(arg) + 1):
            assert eng.save(step, state_for(step)).future.result().committed == ("mem", "disk")
        eng.close()
    elif mode == "hang_in_persist":  # commit step 1, then block inside the persist of step 2

        class Blocking(dcp.FileSystemWriter):
            def finish(self, metadata, results):
                (root_p / "mid-persist").write_text("1")
                time.sleep(600)

        state = {"on": False}
        eng = CheckpointEngine(
            _tiers(root_p),
            sink=sink,
            writer_factory=lambda p, t: (
                Blocking(p, sync_files=True) if state["on"] else dcp.FileSystemWriter(p, sync_files=True)
            ),
        )
        eng.save(1, state_for(1)).future.result()
        state["on"] = True
        eng.save(2, state_for(2))
        time.sleep(600)
    elif mode == "full_disk":  # keep saving onto a tiny tmpfs until the disk is full
        eng = CheckpointEngine(_tiers(root_p, Path(arg), keep=50), sink=sink)
        report["results"] = []
        for step in range(1, 8):
            res = eng.save(step, state_for(step)).future.result()
            report["results"].append([step, list(res.committed)])
        eng.close()
    elif mode == "resume":  # what a restarted run does, then it checkpoints on
        eng = CheckpointEngine(_tiers(root_p, Path(arg) if arg else None), sink=sink)
        target = _zeros()
        got = eng.load_latest(target)
        report["loaded"] = None if got is None else [got.step, got.tier]
        report["exact"] = got is not None and all(
            torch.equal(target[g][k], state_for(got.step)[g][k])
            for g in ("model", "optim")
            for k in target[g]
        )
        report["step_field"] = target["step"]
        if got is not None:
            nxt = got.step + 1
            report["next_commit"] = list(eng.save(nxt, state_for(nxt)).future.result().committed)
        eng.close()
    (root_p / f"{mode}.json").write_text(json.dumps(report))


def _run(mode: str, root: Path, arg: str = "") -> dict:
    import warm  # deferred: this file is also the trainer script, where tests/ need not be on the path

    code, out = warm.run(HERE, [mode, str(root), arg])  # forked warm: torch is imported once
    assert code == 0, out[-3000:]
    return json.loads((root / f"{mode}.json").read_text())


def _committed_good(root: Path, sub: str) -> list[int]:
    from stalwart.checkpoint.manifest import verify

    d = root / sub
    return sorted(
        int(p.name[5:]) for p in d.iterdir() if p.name.startswith("step-") and verify(p)[0] is not None
    )


def _first_data_file(d: Path) -> Path:
    return sorted(p for p in d.iterdir() if p.suffix == ".distcp")[0]


def _flip(d: Path) -> None:
    f = _first_data_file(d)
    raw = bytearray(f.read_bytes())
    raw[len(raw) // 3] ^= 0x01
    f.write_bytes(bytes(raw))


def _truncate(d: Path) -> None:
    f = _first_data_file(d)
    os.truncate(f, f.stat().st_size // 2)


def _drop_shard(d: Path) -> None:
    _first_data_file(d).unlink()


@pytest.fixture(scope="module")
def committed_1_to_3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Steps 1-3 committed on both tiers by one trainer process, shared by the damage cases (each
    damages its own copy)."""
    root = tmp_path_factory.mktemp("committed")
    _run("train", root, "3")
    return root


@pytest.mark.parametrize(
    "damage,reason",
    [(_flip, "corrupted"), (_truncate, "truncated"), (_drop_shard, "missing file")],
    ids=["bitflip", "truncated", "missing"],
)
def test_damaged_newest_version_resumes_from_the_newest_good_one(tmp_path, committed_1_to_3, damage, reason):
    for sub in ("shm", "disk"):  # a copy of one trained run's tiers: every damage kind starts alike
        shutil.copytree(committed_1_to_3 / sub, tmp_path / sub, symlinks=True)
    for sub in ("shm", "disk"):
        damage(tmp_path / sub / "step-000000003")
    rep = _run("resume", tmp_path)
    assert rep["loaded"] == [2, "mem"] and rep["exact"] and rep["step_field"] == 2
    rejected = [e for e in rep["events"] if e[0] == "CheckpointRejected"]
    assert [e[1] for e in rejected] == [3, 3] and all(reason in e[2] for e in rejected)
    assert rep["next_commit"] == ["mem", "disk"]  # the run goes on and checkpoints step 3 again
    for sub in ("shm", "disk"):  # nothing good that was committed is lost
        assert _committed_good(tmp_path, sub) == [1, 2, 3]


def test_kill_9_mid_persist_never_resumes_from_the_torn_version(tmp_path):
    import warm  # deferred: as in _run

    proc = warm.start(HERE, ["hang_in_persist", str(tmp_path), ""], dict(os.environ))
    deadline = time.monotonic() + 120
    while not (tmp_path / "mid-persist").exists():
        assert proc.poll() is None, proc.output()[-3000:]
        assert time.monotonic() < deadline, "the trainer never reached the persist"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    torn = tmp_path / "shm" / ".step-000000002.partial"
    assert torn.is_dir() and any(p.suffix == ".distcp" for p in torn.iterdir())  # really torn, mid-write
    rep = _run("resume", tmp_path)
    assert rep["loaded"] == [1, "mem"] and rep["exact"]
    assert not torn.exists()  # swept before the next save
    assert rep["next_commit"] == ["mem", "disk"]
    assert _committed_good(tmp_path, "shm") == [1, 2] and _committed_good(tmp_path, "disk") == [1, 2]


@pytest.fixture
def tiny_tmpfs(tmp_path):
    mnt = tmp_path / f"full-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mnt)], capture_output=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=False)


def test_full_disk_fails_the_save_and_keeps_every_committed_version(tmp_path, tiny_tmpfs):
    rep = _run("full_disk", tmp_path, str(tiny_tmpfs))
    results = dict((s, c) for s, c in rep["results"])
    disk_ok = [s for s, c in results.items() if "disk" in c]
    assert (
        disk_ok and disk_ok == list(range(1, len(disk_ok) + 1)) and len(disk_ok) < 7
    )  # then the disk filled
    failed = [e for e in rep["events"] if e[0] == "CheckpointPersistFailed"]
    assert failed and all("No space left" in e[2] for e in failed)
    assert not any(p.name.endswith(".partial") for p in tiny_tmpfs.iterdir())
    good = sorted(int(p.name[5:]) for p in tiny_tmpfs.iterdir() if p.name.startswith("step-"))
    assert good == disk_ok
    from stalwart.checkpoint.manifest import verify

    assert all(verify(tiny_tmpfs / f"step-{s:09d}")[0] is not None for s in good)
    # a resumed run (memory tier lost with the node) comes back from the newest good disk version
    shutil.rmtree(tmp_path / "shm")
    rep2 = _run("resume", tmp_path, str(tiny_tmpfs))
    assert rep2["loaded"] == [max(good), "disk"] and rep2["exact"]
    assert "disk" not in rep2["next_commit"]  # still full: that save fails too, and harms nothing
    assert all(verify(tiny_tmpfs / f"step-{s:09d}")[0] is not None for s in good)


if __name__ == "__main__":
    _main(*sys.argv[1:4])
