"""The agent's straggler actuators without processes: the precision history it reads before an
attempt, and the quarantine it records when this node is excluded."""

from __future__ import annotations

from stalwart.events import ChaosInjected, StragglerDetected
from stalwart.health.node_store import HealthStore
from stalwart.launch.attempt.straggler_exclusion import quarantine_node, straggler_precision
from stalwart.ledger import LedgerWriter
from stalwart.protocol.run_dir import RunDir

T0 = 1_000_000.0


def _firing(ts, attempt, rank=3, run="r1", node="n1"):
    return StragglerDetected(
        ts=ts, run_id=run, node=node, attempt=attempt, rank=rank, score=2.0, step=30, evidence=""
    )


def _write(path, evs):
    with LedgerWriter(path, writer="test") as w:
        w.extend(evs)


def test_precision_counts_the_history_before_this_attempt_only(tmp_path):
    run = RunDir(tmp_path / "run").create()
    chaos = ChaosInjected(ts=T0, run_id="r1", node="n1", attempt=0, rank=3, fault="slow")
    # attempt 0: a firing confirmed by the chaos fault just before it; attempt 1: an unconfirmed one;
    # attempt 2 (the one about to start, and anything later) is not history
    _write(
        run.agent_ledger("n1", 1),
        [chaos, _firing(T0 + 5, 0), _firing(T0 + 900, 1, rank=0), _firing(T0 + 2000, 2)],
    )
    stats, unread = straggler_precision(run.root, None, "r1", 2)
    assert unread == []
    assert (stats.firings, stats.confirmed) == (2, 1)
    assert straggler_precision(run.root, None, "r1", 0)[0] is None  # nothing before the first attempt


def test_a_given_history_adds_to_the_run_and_an_unreadable_one_is_reported_not_fatal(tmp_path):
    run = RunDir(tmp_path / "run").create()
    _write(run.agent_ledger("n1", 1), [_firing(T0 + 5, 0)])
    other = tmp_path / "earlier.ledger"
    _write(other, [_firing(T0 - 5000 + i * 400, 0, run="old") for i in range(4)])
    stats, _ = straggler_precision(run.root, other, "r1", 1)
    assert stats.firings == 5
    bad = tmp_path / "garbage.ledger"
    bad.write_text("not a ledger")
    stats, unread = straggler_precision(run.root, bad, "r1", 1)
    assert stats.firings == 1 and len(unread) == 1 and "garbage.ledger" in unread[0]


def test_quarantine_is_recorded_in_the_node_records_like_a_failed_check(tmp_path):
    state = quarantine_node(
        "n1", "rank 3 makes the job 4.00x slower", now=T0, state_dir=tmp_path, backend="local"
    )
    assert state.startswith("quarantined")
    store = HealthStore(tmp_path)
    rec = store.record("n1")
    assert rec.state.value == "quarantined" and "straggler: rank 3" in rec.reason
    assert store.excluded() == {"n1"}
    kinds = [e.kind for e in store.events()]
    assert "HealthChecked" not in kinds, "no health check ran: none is recorded (it would count as one)"
    assert kinds == ["NodeDrained", "NodeStateChanged"]


def test_listens_on_tells_a_port_this_process_listens_on_from_one_it_does_not():
    import socket

    from stalwart.launch.attempt.straggler_exclusion import listens_on

    with socket.create_server(("127.0.0.1", 0)) as srv:
        port = srv.getsockname()[1]
        assert listens_on(port) is True
        with socket.socket() as other:  # a port bound but not listening is not a store
            other.bind(("127.0.0.1", 0))
            assert listens_on(other.getsockname()[1]) is False


def test_listens_on_says_it_cannot_tell_without_proc(tmp_path):
    from stalwart.launch.attempt.straggler_exclusion import listens_on

    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "tcp").write_text("header\n  0: 0100007F:1F90 00000000:0000 0A 0 0 0 0 0 0 12345\n")
    assert listens_on(0x1F90, proc=tmp_path) is None  # a listener exists, but no fd table to look in
