"""The agent side of an in-place re-formation (launch/inplace.py) after it started: it completes when
every rank joined the new generation, and falls down the ladder when a rank exits or time runs out."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from stalwart.events import DecisionTaken, ReformedInPlace
from stalwart.launch.clock import ManualClock
from stalwart.launch.decision import AttemptOutcome, Decision, DecisionKind
from stalwart.launch.fakes import RecordingLedger
from stalwart.launch.inplace import InPlaceRecovery, Pending, proc_state
from stalwart.launch.progress import ProgressTracker
from stalwart.policy.inplace import InPlace
from stalwart.policy.job import AttemptStatus
from stalwart.policy.restart_policy import Failure
from stalwart.protocol import Reformed

RANKS = [0, 1, 2, 3]


def _recovery(clock: ManualClock, ledger: RecordingLedger) -> InPlaceRecovery:
    tracker = ProgressTracker(ranks=RANKS, started=clock.now())
    rec = InPlaceRecovery(
        cfg=SimpleNamespace(),
        ledger=ledger,
        group=None,
        receiver=None,
        block=None,
        tracker=tracker,
        num_nodes=1,
        attempt=0,
        clock=clock,
        generation=1,
    )
    failure = Failure("crash", 0, 17, 2, "killed by SIGKILL")
    outcome = AttemptOutcome(AttemptStatus.FAILED, failure=failure, detected_at=clock.now())
    d = Decision(DecisionKind.CRASH, "rank 2 killed", outcome=outcome, rank=2, onset=clock.now() - 0.2)
    plan = InPlace(frozenset({2}), 1, "rank 2 replaced in place")
    rec.pending = Pending(d, plan, clock.now(), clock.now() + 90.0, 17, 0.1)
    return rec


def _snap(clock: ManualClock, codes: dict[int, int | None] | None = None):
    return SimpleNamespace(now=clock.now(), codes=codes or dict.fromkeys(RANKS))


def _join(rec: InPlaceRecovery, rank: int, step: int, received: int, t: float) -> None:
    phases = {"abort": 0.05, "wait": 0.1, "rendezvous": 0.3 + rank / 10, "transfer": 0.2}
    rec.tracker.observe(Reformed(rank, 1, step, received, phases, t), t)


def test_the_re_formation_completes_when_every_rank_joined_and_records_its_phases():
    clock, ledger = ManualClock(), RecordingLedger()
    rec = _recovery(clock, ledger)
    for r in (0, 1, 3):
        _join(rec, r, 17, 0, clock.now())
    assert rec.follow(_snap(clock)) is None and rec.pending is not None  # rank 2 has not joined yet
    _join(rec, 2, 17, 4096, clock.now())
    assert rec.follow(_snap(clock)) is None and rec.pending is None
    [done] = ledger.of(ReformedInPlace)
    assert (done.ranks, done.step, done.lost_steps, done.bytes_moved) == ((2,), 17, 0, 4096)
    assert done.phases["rendezvous"] == pytest.approx(0.6)  # the slowest rank's
    assert done.phases["detect"] == pytest.approx(0.2) and done.phases["replace"] == pytest.approx(0.1)


def test_a_rank_that_exits_during_the_re_formation_sends_the_failure_down_the_ladder():
    clock, ledger = ManualClock(), RecordingLedger()
    rec = _recovery(clock, ledger)
    original = rec.pending.decision
    got = rec.follow(_snap(clock, {0: None, 1: 1, 2: None, 3: None}))
    assert got is original and rec.pending is None
    [why] = [e for e in ledger.of(DecisionTaken) if e.action == "in_place_failed"]
    assert "rank 1 exited" in why.reason
    assert not ledger.of(ReformedInPlace)


def test_a_re_formation_that_does_not_finish_in_time_is_abandoned_naming_the_missing_ranks():
    clock, ledger = ManualClock(), RecordingLedger()
    rec = _recovery(clock, ledger)
    original = rec.pending.decision
    _join(rec, 0, 17, 0, clock.now())
    clock.advance(89.0)
    assert rec.follow(_snap(clock)) is None and rec.pending is not None
    clock.advance(2.0)
    assert rec.follow(_snap(clock)) is original and rec.pending is None
    [why] = [e for e in ledger.of(DecisionTaken) if e.action == "in_place_failed"]
    assert "ranks 1, 2, 3 did not join generation 1" in why.reason


def test_the_kernel_state_of_a_process_is_read_from_proc(tmp_path):
    import os

    assert proc_state(os.getpid()) in ("R", "S")
    assert proc_state(2**22 + 12345) == ""
