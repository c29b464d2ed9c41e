"""Run and log directories are created private (0700 levels, 0600 files) and never written through a
link; what is refused names what to remove."""

from __future__ import annotations

import os
import stat

import pytest

from stalwart.errors import ConfigError
from stalwart.protocol.private_paths import PathRefused, open_log
from stalwart.protocol.run_dir import RunDir


def _mode(p) -> int:
    return stat.S_IMODE(p.lstat().st_mode)


def _append(path, root=None, text=b"x\n") -> None:
    fd = open_log(path, root)
    try:
        os.write(fd, text)
    finally:
        os.close(fd)


def test_every_level_below_the_log_dir_is_0700_and_the_file_0600(tmp_path):
    old = os.umask(0)
    try:
        _append(tmp_path / "ld" / "run" / "attempt_0" / "0" / "stdout.log", tmp_path / "ld")
    finally:
        os.umask(old)
    for d in ("ld", "ld/run", "ld/run/attempt_0", "ld/run/attempt_0/0"):
        assert _mode(tmp_path / d) == 0o700, d
    assert _mode(tmp_path / "ld/run/attempt_0/0/stdout.log") == 0o600


def test_an_existing_log_and_level_of_ours_are_taken_back_to_0600_and_0700(tmp_path):
    (tmp_path / "ld" / "run").mkdir(parents=True)
    (tmp_path / "ld" / "run").chmod(0o755)
    log = tmp_path / "ld" / "run" / "out.log"
    log.write_bytes(b"a\n")
    log.chmod(0o644)
    _append(log, tmp_path / "ld", b"b\n")
    assert log.read_bytes() == b"a\nb\n"
    assert _mode(log) == 0o600 and _mode(log.parent) == 0o700


def test_a_linked_log_file_is_refused_and_its_target_untouched(tmp_path):
    target = tmp_path / "target"
    target.write_text("keep\n")
    (tmp_path / "ld").mkdir()
    (tmp_path / "ld" / "out.log").symlink_to(target)
    with pytest.raises(PathRefused, match="out.log is a symbolic link") as err:
        _append(tmp_path / "ld" / "out.log")
    assert err.value.hint.startswith(f"remove {tmp_path / 'ld' / 'out.log'}")
    assert target.read_text() == "keep\n"


def test_a_hard_linked_log_file_is_refused(tmp_path):
    (tmp_path / "ld").mkdir()
    (tmp_path / "other").write_text("keep\n")
    os.link(tmp_path / "other", tmp_path / "ld" / "out.log")
    with pytest.raises(PathRefused, match="2 hard links"):
        _append(tmp_path / "ld" / "out.log")
    assert (tmp_path / "other").read_text() == "keep\n"


def test_a_linked_level_below_the_log_dir_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "ld").mkdir()
    (tmp_path / "ld" / "run").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(PathRefused, match="run is a symbolic link or not a directory"):
        _append(tmp_path / "ld" / "run" / "attempt_0" / "out.log", tmp_path / "ld")
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_level_others_can_write_in_is_refused(tmp_path):
    (tmp_path / "ld" / "run").mkdir(parents=True)
    (tmp_path / "ld" / "run").chmod(0o777)
    with pytest.raises(PathRefused, match="mode 0777, not 0700"):
        _append(tmp_path / "ld" / "run" / "out.log", tmp_path / "ld")


def test_a_log_dir_that_is_our_own_link_is_followed(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "ld").symlink_to(tmp_path / "real")
    _append(tmp_path / "ld" / "run" / "out.log", tmp_path / "ld")
    assert (tmp_path / "real" / "run" / "out.log").read_bytes() == b"x\n"


def test_a_log_file_outside_its_root_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="is not under"):
        open_log(tmp_path / "a" / "out.log", tmp_path / "b")


def test_the_run_directory_levels_are_0700_and_a_linked_one_is_refused(tmp_path):
    old = os.umask(0)
    try:
        run = RunDir(tmp_path / "runs" / "r1").create()
    finally:
        os.umask(old)
    for d in (tmp_path / "runs", run.root, run.ledger, run.checkpoints, run.logs, run.control):
        assert _mode(d) == 0o700, d
    (tmp_path / "x").mkdir()
    other = RunDir(tmp_path / "r2")
    other.root.mkdir()
    other.ledger.symlink_to(tmp_path / "x")
    with pytest.raises(PathRefused, match="ledger is a symbolic link"):
        other.create()
    assert list((tmp_path / "x").iterdir()) == []
