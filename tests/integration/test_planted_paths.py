"""Paths another local user can plant before a root run starts are refused, and nothing is deleted
or overwritten through them. The plants are made by uid 65534 (no account, no capability) through
``setpriv``, in the real /dev/shm."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import uuid
from pathlib import Path

import pytest

from stalwart.checkpoint.node_memory import NodeMemory
from stalwart.errors import CheckpointError
from stalwart.protocol import control
from stalwart.protocol.run_dir import RunDir
from stalwart.serve.file_sd import write_target

pytestmark = pytest.mark.integration
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
SHM = Path("/dev/shm")


def as_nobody(*cmd: str) -> None:
    subprocess.run([*NOBODY, *cmd], check=True, timeout=30)


@pytest.fixture
def run_id(monkeypatch):
    monkeypatch.delenv("STALWART_SHM_DIR", raising=False)  # the real, shared /dev/shm
    rid = f"sec-plant-{uuid.uuid4().hex[:8]}"
    yield rid
    planted = SHM / f"stalwart-{os.geteuid()}-{rid}"
    if planted.is_symlink():
        planted.unlink()
    elif planted.exists():
        shutil.rmtree(planted)


@pytest.mark.skipif(os.geteuid() != 0, reason="plants as another user need root (as in CI)")
def test_a_symlink_planted_as_the_run_directory_is_avoided_and_nothing_is_deleted(run_id, tmp_path):
    victim = tmp_path / "victim"
    (victim / "n0").mkdir(parents=True, mode=0o700)
    victim.chmod(0o700)
    (victim / "n0" / "precious").write_text("keep me")
    planted = SHM / f"stalwart-0-{run_id}"
    as_nobody("ln", "-s", str(victim), str(planted))
    mem = NodeMemory(run_id=run_id, node="n0", host=None)
    try:
        _assert_private_elsewhere(mem, planted)
        assert "symbolic link" in mem.notice
    finally:
        mem.close()
    assert (victim / "n0" / "precious").read_text() == "keep me"
    assert not mem.root.parent.exists() and planted.is_symlink()


@pytest.mark.skipif(os.geteuid() != 0, reason="plants as another user need root (as in CI)")
def test_a_run_directory_planted_by_another_user_is_avoided_and_the_memory_tier_stays_on(run_id):
    planted = SHM / f"stalwart-0-{run_id}"
    as_nobody("mkdir", "-m", "0777", str(planted))  # the parent only: the node directory would be ours
    as_nobody("touch", str(planted / "theirs"))
    mem = NodeMemory(run_id=run_id, node="n0", host=None)
    try:
        _assert_private_elsewhere(mem, planted)
        assert "owned by uid 65534" in mem.notice and f"remove {planted}" in mem.notice
        assert mem.env()["mem_dir"] == str(mem.root)  # the workers learn the directory actually used
    finally:
        mem.close()
    assert (planted / "theirs").exists() and not (planted / "n0").exists()  # nothing made in theirs


def _assert_private_elsewhere(mem: NodeMemory, planted: Path) -> None:
    run = mem.root.parent
    assert run != planted and run.parent == SHM and run.name.startswith(planted.name + "-")
    for d in (run, mem.root, mem.versions_root):
        st = d.lstat()
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid(), d
        assert stat.S_IMODE(st.st_mode) == 0o700, d


def test_our_own_0777_run_directory_is_refused_too(run_id):
    own = SHM / f"stalwart-{os.geteuid()}-{run_id}"
    own.mkdir()
    own.chmod(0o777)
    with pytest.raises(CheckpointError, match="mode 0777, not 0700"):
        NodeMemory(run_id=run_id, node="n0", host=None)


def test_a_symlink_planted_as_the_node_directory_is_refused(run_id, tmp_path):
    run = SHM / f"stalwart-{os.geteuid()}-{run_id}"
    run.mkdir(mode=0o700)
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "keep").write_text("x")
    (run / "n0").symlink_to(tmp_path / "target")
    with pytest.raises(CheckpointError, match="symbolic link"):
        NodeMemory(run_id=run_id, node="n0", host=None)
    assert (tmp_path / "target" / "keep").exists()


def test_a_clean_start_is_0700_and_close_removes_it(run_id):
    mem = NodeMemory(run_id=run_id, node="n0", host=None)
    run = SHM / f"stalwart-{os.geteuid()}-{run_id}"
    assert oct(run.stat().st_mode & 0o777) == oct(mem.root.stat().st_mode & 0o777) == "0o700"
    mem.close()
    assert not run.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="plants as another user need root (as in CI)")
def test_links_planted_in_a_shared_file_sd_directory_are_replaced_not_written_through(tmp_path):
    shared = SHM / f"sec-sd-{uuid.uuid4().hex[:8]}"
    shared.mkdir()
    shared.chmod(0o777)  # a directory Prometheus and the job's users share (not sticky)
    try:
        _plant_and_write(shared, tmp_path)
    finally:
        shutil.rmtree(shared)


def _plant_and_write(shared: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("root's file")
    victim.chmod(0o644)
    name = "stalwart-77-n1.json"
    for planted in (name, name + ".tmp", name.replace(".json", ".json.tmp")):
        as_nobody("ln", "-sf", str(victim), str(shared / planted))
    path = write_target(shared, "n1", 9400, {"slurm_job_id": "77", "slurm_node": "n1"})
    assert victim.read_text() == "root's file"
    assert not path.is_symlink() and '"n1:9400"' in path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o644 and path.stat().st_uid == os.geteuid()
    assert [p.name for p in shared.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()] == []


def test_the_run_directory_and_its_private_files_are_0700_and_0600(tmp_path):
    run = RunDir(tmp_path / "runs" / "r1").create()
    control.create(run.control_file("n0", 1, 0), slots=2)
    for d in (run.root, run.ledger, run.control, run.errors, run.logs):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    assert stat.S_IMODE(run.control_file("n0", 1, 0).stat().st_mode) == 0o600
