import multiprocessing as mp
import os
import signal
import sqlite3

import pytest

from stalwart.errors import LedgerError
from stalwart.events import FailureDetected, JobStarted, RawEvent, StepCompleted, decode, encode
from stalwart.ledger import LedgerWriter, read_file, read_merged


def test_roundtrip_preserves_every_field(tmp_path):
    ev = StepCompleted(
        ts=1.5,
        run_id="r",
        node="n0",
        attempt=2,
        rank=3,
        step=7,
        start=1.0,
        duration=0.5,
        sections={"forward": 0.2},
    )
    path = tmp_path / "a.ledger"
    with LedgerWriter(path) as w:
        w.append(ev)
        w.append(JobStarted(ts=1.0, script="x.py", args=("--a", "1")))
    got = read_file(path)
    assert got[0] == ev
    assert got[1].args == ("--a", "1")


def test_unknown_kind_comes_back_raw():
    ev = decode("FutureThing", '{"ts": 3.0, "rank": 1, "novel": 5}')
    assert isinstance(ev, RawEvent) and ev.raw_kind == "FutureThing" and ev.payload["novel"] == 5
    kind, payload = encode(ev)
    assert kind == "FutureThing" and '"novel":5' in payload


def test_merge_orders_by_time_across_files(tmp_path):
    with (
        LedgerWriter(tmp_path / "ledger" / "a.ledger") as a,
        LedgerWriter(tmp_path / "ledger" / "b.ledger") as b,
    ):
        a.append(StepCompleted(ts=3.0, step=3, start=2.0, duration=1.0))
        b.append(StepCompleted(ts=1.0, step=1, start=0.0, duration=1.0))
        a.append(StepCompleted(ts=2.0, step=2, start=1.0, duration=1.0))
    assert [e.step for e in read_merged(tmp_path)] == [1, 2, 3]


def test_second_writer_is_refused(tmp_path):
    path = tmp_path / "a.ledger"
    with LedgerWriter(path):
        with pytest.raises(LedgerError, match="already has a writer"):
            LedgerWriter(path)


def test_foreign_and_garbage_files_give_clear_errors(tmp_path):
    garbage = tmp_path / "g.ledger"
    garbage.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(LedgerError, match="not a Stalwart ledger"):
        read_file(garbage)
    foreign = tmp_path / "f.ledger"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE meta(key TEXT, value TEXT)")
    conn.execute("INSERT INTO meta VALUES ('format', 'something-else')")
    conn.commit()
    conn.close()
    with pytest.raises(LedgerError, match="not a Stalwart ledger"):
        read_file(foreign)
    with pytest.raises(LedgerError, match="does not exist"):
        read_file(tmp_path / "missing.ledger")
    with pytest.raises(LedgerError, match="no ledger files"):
        read_merged(tmp_path / "nothing-here") if (tmp_path / "nothing-here").mkdir() is None else None


def _write_then_die(path, n):
    w = LedgerWriter(path)
    for i in range(n):
        w.append(FailureDetected(ts=float(i), failure="crash", evidence=f"e{i}", onset=float(i)))
    os.kill(os.getpid(), signal.SIGKILL)


def test_appends_survive_sigkill_of_the_writer(tmp_path):
    path = tmp_path / "a.ledger"
    p = mp.get_context("fork").Process(target=_write_then_die, args=(path, 50))
    p.start()
    p.join(30)
    assert p.exitcode == -signal.SIGKILL
    events = read_file(path)
    assert [e.evidence for e in events] == [f"e{i}" for i in range(50)]
    # and a new writer can take over the file after the crash
    with LedgerWriter(path) as w:
        w.append(FailureDetected(ts=99.0, failure="hang", evidence="x", onset=99.0))
    assert len(read_file(path)) == 51
