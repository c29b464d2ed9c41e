"""Paths another local user can plant before a root run starts are refused, and nothing is deleted
or overwritten through them. The plants are made by uid 65534 (no account, no capability) through
``setpriv``, in the real /dev/shm."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from stalwart.checkpoint.node_memory import NodeMemory
from stalwart.errors import CheckpointError, ConfigError
from stalwart.launch.output import routes
from stalwart.launch.processes.worker_group import WorkerGroup, WorkerSpec
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


@pytest.fixture
def shared_log_dir():
    """A --log-dir every local user can write in (sticky, like /tmp), owned by this user."""
    shared = SHM / f"sec-logs-{uuid.uuid4().hex[:8]}"
    shared.mkdir()
    shared.chmod(0o1777)
    yield shared
    shutil.rmtree(shared)


def _run_worker(log_dir: Path, run_id: str, run_log: Path) -> None:
    """One worker whose stdout goes (--redirects 1) to ``<log_dir>/<run id>/attempt_0/0/stdout.log``."""
    (route,) = routes(
        nproc=1,
        redirects="1",
        tee="0",
        ranks_filter="",
        log_dir=log_dir / run_id / "attempt_0",
        run_log=[run_log],
        log_root=log_dir,
    )
    spec = WorkerSpec(0, 0, dict(os.environ), run_log, route=route)
    group = WorkerGroup([sys.executable, "-c", "print('worker output')"], [spec])
    try:
        group.start()
        assert group.wait_all(30)
    finally:
        group.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="plants as another user need root (as in CI)")
def test_a_log_file_planted_as_a_link_under_the_log_dir_is_refused_and_not_written(shared_log_dir, tmp_path):
    victim = tmp_path / "root-only"
    victim.write_text("root's file\n")
    victim.chmod(0o600)
    rid = "sec-logs"
    as_nobody("mkdir", "-p", str(shared_log_dir / rid / "attempt_0" / "0"))
    as_nobody("ln", "-s", str(victim), str(shared_log_dir / rid / "attempt_0" / "0" / "stdout.log"))
    (tmp_path / "logs").mkdir(mode=0o700)
    with pytest.raises(ConfigError, match="owned by uid 65534.*planted") as err:
        _run_worker(shared_log_dir, rid, tmp_path / "logs" / "n0-a0-r0.log")
    assert err.value.hint.startswith(f"remove {shared_log_dir / rid}")
    assert victim.read_text() == "root's file\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="plants as another user need root (as in CI)")
def test_a_run_directory_of_the_log_dir_made_in_advance_by_another_user_is_refused(shared_log_dir, tmp_path):
    as_nobody("mkdir", "-m", "0700", str(shared_log_dir / "sec-early"))
    (tmp_path / "logs").mkdir(mode=0o700)
    with pytest.raises(ConfigError, match="sec-early is owned by uid 65534"):
        _run_worker(shared_log_dir, "sec-early", tmp_path / "logs" / "n0-a0-r0.log")


def test_log_dir_levels_are_0700_and_log_files_0600_whatever_the_umask(shared_log_dir, tmp_path):
    old = os.umask(0o022)
    try:
        RunDir(tmp_path / "run").create()
        _run_worker(shared_log_dir, "sec-modes", RunDir(tmp_path / "run").log_file("n0", 0, 0))
    finally:
        os.umask(old)
    leaf = shared_log_dir / "sec-modes" / "attempt_0" / "0"
    for d in (leaf.parent.parent, leaf.parent, leaf):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    for f in (leaf / "stdout.log", RunDir(tmp_path / "run").log_file("n0", 0, 0)):
        assert f.read_text() == "worker output\n"
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f


@pytest.mark.skipif(os.geteuid() != 0, reason="plants as another user need root (as in CI)")
def test_a_run_directory_made_in_advance_by_another_user_is_refused(shared_log_dir):
    planted = shared_log_dir / "run-early"
    as_nobody("mkdir", "-m", "0777", str(planted))
    with pytest.raises(ConfigError, match="owned by uid 65534.*planted") as err:
        RunDir(planted).create()
    assert err.value.hint.startswith(f"remove {planted}")
    assert list(planted.iterdir()) == []  # nothing made in theirs
    victim = shared_log_dir / "root-only"
    victim.mkdir(mode=0o700)
    as_nobody("ln", "-s", str(victim), str(shared_log_dir / "run-link"))
    with pytest.raises(ConfigError, match="run-link is a symbolic link"):
        RunDir(shared_log_dir / "run-link").create()
    with pytest.raises(ConfigError, match="run-link is a symbolic link of uid 65534"):
        RunDir(shared_log_dir / "run-link" / "sub").create()  # nor on the way to it
    assert list(victim.iterdir()) == []
