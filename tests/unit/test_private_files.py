"""Files and directories of a run are private whatever the umask (docs/security.md, "Files and
names"): directories 0700, files 0600. Each writer here used to leave 0644 files or 0755
directories under the usual umask 022."""

from __future__ import annotations

import faulthandler
import os
import stat
from pathlib import Path

import pytest

from stalwart.chaos.once import claim, claim_announcement
from stalwart.chaos.plan import parse_spec
from stalwart.checkpoint.manifest import Manifest
from stalwart.checkpoint.store import FileStore
from stalwart.launch.processes.bootstrap import _stacks
from stalwart.ledger import LedgerWriter
from stalwart.protocol import STACK_DUMP_SIGNAL
from stalwart.protocol.error_record import write_error
from stalwart.protocol.run_dir import RunDir
from stalwart.train.process_guard import ProcessGuard


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


@pytest.fixture(autouse=True)
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_a_committed_checkpoints_files_are_0600(tmp_path):
    store = FileStore(tmp_path / "ckpt", fsync=False, key=b"")
    work = store.begin(5)
    (work / "__0_0.distcp").write_bytes(b"x")  # as torch's writer leaves it: 0644 under umask 022
    final = store.commit(5, Manifest(step=5, world_size=1, files={}, created=1.0))
    assert {f.name: _mode(f) for f in final.iterdir()} == {"__0_0.distcp": 0o600, "MANIFEST.json": 0o600}
    assert _mode(final) == 0o700


def test_a_ledger_in_a_new_directory_makes_every_level_0700(tmp_path):
    # a node's health state directory in the run directory, a simulated run's (sim --write-ledger)
    with LedgerWriter(tmp_path / "sim-run" / "ledger" / "sim.ledger", writer="t"):
        pass
    assert _mode(tmp_path / "sim-run") == _mode(tmp_path / "sim-run" / "ledger") == 0o700
    assert _mode(tmp_path / "sim-run" / "ledger" / "sim.ledger") == 0o600


def test_stack_files_and_error_records_are_0600(tmp_path):
    run = RunDir(tmp_path / "run")
    guard = ProcessGuard(on_signal=lambda s: None, stack_file=run.stack_file("n0", 0, 1)).install()
    try:
        assert _mode(run.stack_file("n0", 0, 1)) == 0o600  # the SDK's
    finally:
        guard.close()
    fh = _stacks(run, "n0", 0, 2)  # the bootstrap's, for a script without the SDK
    try:
        assert fh is not None and _mode(run.stack_file("n0", 0, 2)) == 0o600
    finally:
        faulthandler.unregister(STACK_DUMP_SIGNAL)
        if fh is not None:
            fh.close()
    record = run.error_file("n0", 0, 1)
    write_error(record, KeyError, KeyError("lr"), None, step=3, rank=1)
    assert _mode(record) == 0o600


def test_chaos_markers_are_0600(tmp_path):
    fault = parse_spec("crash@rank=1,step=5")
    assert claim(tmp_path / "chaos", fault) and claim_announcement(tmp_path / "chaos", fault)
    assert {f.name.split("-")[0]: _mode(f) for f in (tmp_path / "chaos").iterdir()} == {
        "fired": 0o600,
        "announced": 0o600,
    }
