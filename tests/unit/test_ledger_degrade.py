"""Ledgers degrade instead of failing: atomic creation, a full disk, bad rows, foreign side ledgers."""

import errno
import os
import sqlite3
import stat

import pytest

from stalwart.errors import LedgerError, LedgerFullError, LedgerNotReadyError
from stalwart.events import StepCompleted
from stalwart.events.node_health import NodeStateChanged
from stalwart.health.node_store import HealthStore
from stalwart.ledger import LedgerWriter, check_format, read_available, read_file
from stalwart.ledger import store as store_mod


def _step(i):
    return StepCompleted(ts=float(i), step=i, start=i - 1.0, duration=1.0)


def test_new_ledger_is_private_and_complete(tmp_path):
    path = tmp_path / "a.ledger"
    with LedgerWriter(path) as w:
        w.append(_step(1))
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0
        check_format(path)  # a reader sees the meta table from the first moment the file exists
    assert not list(tmp_path.glob(".*creating*"))


def test_creation_interrupted_leaves_no_table_less_ledger(tmp_path, monkeypatch):
    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store_mod.os, "replace", full)
    with pytest.raises(LedgerFullError, match="disk is full"):
        LedgerWriter(tmp_path / "a.ledger")
    assert not (tmp_path / "a.ledger").exists()
    assert not list(tmp_path.glob(".*creating*"))
    monkeypatch.undo()
    with LedgerWriter(tmp_path / "a.ledger") as w:  # the lock was released
        w.append(_step(1))
    assert len(read_file(tmp_path / "a.ledger")) == 1


def test_full_disk_on_append_is_a_ledger_full_error_and_keeps_earlier_events(tmp_path):
    path = tmp_path / "a.ledger"
    w = LedgerWriter(path)
    w.append(_step(1))
    pages = w._conn.execute("PRAGMA page_count").fetchone()[0]
    w._conn.execute(f"PRAGMA max_page_count={pages + 1}")  # SQLite's own "database or disk is full"
    big = StepCompleted(ts=2.0, step=2, start=1.0, duration=1.0, sections={f"s{i}": 1.0 for i in range(5000)})
    with pytest.raises(LedgerFullError) as info:
        w.extend([big] * 5)
    assert info.value.exit_code == 75
    w.close()
    assert [e.step for e in read_file(path)] == [1]


def test_reader_waits_on_a_ledger_being_created(tmp_path):
    empty = tmp_path / "a.ledger"
    empty.touch()
    with pytest.raises(LedgerNotReadyError):
        check_format(empty)
    # an old-style writer committed the tables but not yet the meta rows
    young = tmp_path / "b.ledger"
    conn = sqlite3.connect(young)
    conn.executescript(store_mod._SCHEMA)
    conn.close()
    st = young.stat()
    with pytest.raises(LedgerNotReadyError):
        check_format(young, now=st.st_mtime + 1)
    with pytest.raises(LedgerError, match="not a Stalwart ledger") as info:
        check_format(young, now=st.st_mtime + 3600)
    assert not isinstance(info.value, LedgerNotReadyError)


def test_writer_takes_over_an_empty_file(tmp_path):
    path = tmp_path / "a.ledger"
    path.touch()
    with LedgerWriter(path) as w:
        w.append(_step(1))
    assert len(read_file(path)) == 1


def _insert_raw(path, rows):
    conn = sqlite3.connect(path)
    conn.executemany("INSERT INTO events(ts, kind, payload) VALUES (?, ?, ?)", rows)
    conn.commit()
    conn.close()


def test_bad_payload_rows_are_skipped_with_reasons(tmp_path):
    path = tmp_path / "ledger" / "a.ledger"
    with LedgerWriter(path) as w:
        w.append(_step(1))
    _insert_raw(
        path,
        [
            (2.0, "StepCompleted", "not json {"),
            (3.0, "StepCompleted", "null"),
            (4.0, "StepCompleted", "[1, 2]"),
            (5.0, "StepCompleted", '{"ts": "soon", "step": 1, "start": 0, "duration": 1}'),
            (6.0, "StepCompleted", '{"ts": 6.0, "step": "six", "start": 0, "duration": 1}'),
            (7.0, "StepCompleted", "[" * 5000 + "]" * 5000),
        ],
    )
    with LedgerWriter(path) as w:
        w.append(_step(8))
    with pytest.raises(LedgerError, match="6 unreadable row"):
        read_file(path)
    got = read_available(tmp_path)
    assert [e.step for e in got.events] == [1, 8]
    assert len(got.skipped) == 1 and got.skipped[0].rows == 6


def test_report_skips_an_unreadable_ledger_and_lists_it(tmp_path):
    from stalwart.account.report import build
    from stalwart.events import JobEnded, JobStarted

    led = tmp_path / "ledger"
    with LedgerWriter(led / "agent-a.ledger") as w:
        w.append(JobStarted(ts=0.0, script="x.py"))
        w.extend(_step(i) for i in range(1, 5))
        w.append(JobEnded(ts=5.0, outcome="succeeded", verdict="ok", exit_code=0, requeue_helps=False))
    (led / "rank-9.ledger").write_bytes(b"garbage" * 100)
    rep = build(tmp_path)
    assert rep["wall_s"] == 5.0  # the readable ledger was used
    assert [s["path"] for s in rep["skipped"]] == [str(led / "rank-9.ledger")]
    (led / "agent-a.ledger").write_bytes(b"garbage" * 100)
    with pytest.raises(LedgerError, match="none of the 2 ledger file"):
        build(tmp_path)


def _state(node, to, ts=1.0):
    return NodeStateChanged(ts=ts, node=node, from_state="healthy", to_state=to, action="none", reason="r")


def test_a_garbage_node_ledger_is_set_aside_and_never_blocks(tmp_path, caplog):
    store = HealthStore(tmp_path)
    store.append("n2", [_state("n2", "quarantined")])
    (tmp_path / "node-n1.ledger").write_bytes(b"\x00garbage" * 64)
    # reading: n2's record survives, n1's file moves out of the *.ledger glob
    assert store.excluded() == {"n2"}
    assert not (tmp_path / "node-n1.ledger").exists()
    assert len(list(tmp_path.glob("node-n1.ledger.corrupt-*"))) == 1
    assert "set aside" in caplog.text
    # writing: a garbage ledger of this very node is set aside and a fresh one started
    (tmp_path / "node-n3.ledger").write_bytes(b"garbage" * 64)
    HealthStore(tmp_path).append("n3", [_state("n3", "suspect")])
    assert HealthStore(tmp_path).record("n3").state.value == "suspect"


def test_unknown_state_in_a_node_ledger_is_skipped(tmp_path):
    store = HealthStore(tmp_path)
    store.append("n1", [_state("n1", "on-fire")])
    assert store.records() == {}


def test_read_only_state_dir_still_does_not_block(tmp_path, monkeypatch):
    (tmp_path / "node-n1.ledger").write_bytes(b"garbage" * 64)

    def refuse(src, dst):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(store_mod.os, "replace", refuse)
    assert HealthStore(tmp_path).records() == {}
    assert os.path.exists(tmp_path / "node-n1.ledger")


def test_readers_racing_writers_never_see_a_foreign_ledger(tmp_path):
    """The race found under load: a reader between the file's creation and its meta table."""
    import threading

    led = tmp_path / "ledger"
    led.mkdir()
    done = threading.Event()
    bad: list[str] = []

    def read_loop():
        while not done.is_set():
            files = sorted(led.glob("*.ledger"))
            if files:
                got = read_available(files, require_some=False)
                bad.extend(s.reason for s in got.skipped)

    reader = threading.Thread(target=read_loop)
    reader.start()
    try:
        for i in range(30):
            with LedgerWriter(led / f"rank-{i}.ledger") as w:
                w.append(_step(i))
    finally:
        done.set()
        reader.join(10)
    assert bad == []
    assert len(read_available(led).events) == 30


def test_a_fifo_in_place_of_a_node_ledger_is_set_aside(tmp_path):
    os.mkfifo(tmp_path / "node-n1.ledger")
    store = HealthStore(tmp_path)
    store.append("n1", [_state("n1", "suspect")])  # would block or fail on a FIFO
    assert store.record("n1").state.value == "suspect"
    assert len(list(tmp_path.glob("node-n1.ledger.corrupt-*"))) == 1
