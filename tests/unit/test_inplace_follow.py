"""The agent side of an in-place re-formation (launch/inplace/recovery.py) after it started: it completes when
every rank joined the new generation, and falls down the ladder when a rank exits or time runs out."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from stalwart.events import DecisionTaken, ReformedInPlace
from stalwart.launch.clock import ManualClock
from stalwart.launch.decision import AttemptOutcome, Decision, DecisionKind
from stalwart.launch.fakes import RecordingBoard, RecordingLedger
from stalwart.launch.inplace.machine import Replaced
from stalwart.launch.inplace.recovery import InPlaceRecovery, Pending, proc_state
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
    )
    failure = Failure("crash", 0, 17, 2, "killed by SIGKILL")
    outcome = AttemptOutcome(AttemptStatus.FAILED, failure=failure, detected_at=clock.now())
    d = Decision(DecisionKind.CRASH, "rank 2 killed", outcome=outcome, rank=2, onset=clock.now() - 0.2)
    plan = InPlace(frozenset({2}), 1, "rank 2 replaced in place")
    rec.apply(Replaced(Pending(d, plan, clock.now(), clock.now() + 90.0, 17, 0.1)))
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


_Board = RecordingBoard


def _node(
    tmp_path,
    clock: ManualClock,
    ledger: RecordingLedger,
    *,
    node: str = "n1",
    ranks: tuple[int, ...] = (2, 3),
    active: tuple[str, ...] = ("n0", "n1"),
    min_nodes: int = 2,
    valid_sizes: str = "",
    spares: bool = False,
):
    """A node of a two-node group that replaced none of its ranks (ranks 2, 3 here)."""
    from stalwart.policy.world_size import SizeRule
    from stalwart.protocol import control

    ctl = tmp_path / "ctl.bin"
    control.create(ctl, slots=2)
    block = control.ControlBlock(ctl, writable=True)
    board = _Board()
    rule = SizeRule("power_of_two") if valid_sizes == "pow2" else SizeRule("multiple", 1)
    cfg = SimpleNamespace(
        reform=SimpleNamespace(enabled=True, announce_s=5.0),
        nproc_per_node=len(ranks),
        min_nodes=min_nodes,
        size_rule=rule,
    )
    rec = InPlaceRecovery(
        cfg=cfg,
        ledger=ledger,
        group=None,
        receiver=None,
        block=block,
        tracker=ProgressTracker(ranks=list(ranks), started=clock.now()),
        num_nodes=len(active),
        attempt=0,
        clock=clock,
        board=board,
        node=node,
        world_size=len(active) * len(ranks),
        active=active,
        spares=spares,
    )
    return rec, board, block


def _snap_at(clock: ManualClock):
    return SimpleNamespace(now=clock.now(), stop_requested_at=None)


def test_a_node_asks_its_ranks_to_join_the_generation_another_node_announced(tmp_path):
    from stalwart.launch.inplace.board import Announcement
    from stalwart.protocol import Reforming

    clock, ledger = ManualClock(), RecordingLedger()
    rec, board, block = _node(tmp_path, clock, ledger)
    rec.tracker.observe(Reforming(2, 1, 0.01, clock.now()), clock.now())
    rec.watch(_snap_at(clock))
    assert block.reform() == 0  # nothing announced yet: the rank waits
    board.seen = Announcement(1, "n0", (1,))
    rec.watch(_snap_at(clock))
    assert block.reform() == 1 and rec.generation == 1
    [joined] = [e for e in ledger.of(DecisionTaken) if e.action == "joined_in_place"]
    assert "node n0" in joined.reason
    rec.watch(_snap_at(clock))  # the same announcement is not joined twice
    assert len([e for e in ledger.of(DecisionTaken) if e.action == "joined_in_place"]) == 1


def test_ranks_left_waiting_past_the_announce_bound_are_told_none_is_coming(tmp_path):
    from stalwart.protocol import Reforming
    from stalwart.protocol.control import REFUSED

    clock, ledger = ManualClock(), RecordingLedger()
    rec, board, block = _node(tmp_path, clock, ledger)
    rec.tracker.observe(Reforming(3, 1, 0.01, clock.now()), clock.now())
    clock.advance(4.9)
    rec.watch(_snap_at(clock))
    assert block.reform() == 0
    clock.advance(0.2)
    rec.watch(_snap_at(clock))
    assert block.reform() == REFUSED
    [why] = [e for e in ledger.of(DecisionTaken) if e.action == "in_place_skipped"]
    assert "within 5s" in why.reason


def test_a_worker_waiting_for_a_generation_gives_up_at_once_when_refused():
    from stalwart.protocol.control import REFUSED
    from stalwart.train.inplace import Generation

    clock = ManualClock()
    t0 = clock.now()
    asked = iter([0, 0, REFUSED])
    gen = Generation(1, lambda: next(asked), clock.sleep, clock.now)
    assert gen.wait(30.0) == 0 and clock.now() - t0 < 1.0  # two polls, not the 30 s bound


def test_a_spare_holding_the_claim_announces_the_next_generation_with_the_lost_nodes_ranks():
    from stalwart.launch.inplace.board import Announcement
    from stalwart.launch.inplace.spare_takeover import SpareWatch
    from stalwart.policy.world_size import WorldPlan

    class Board(_Board):
        def __init__(self) -> None:
            super().__init__()
            self.claims: dict[str, str] = {}
            self.seen = Announcement(2, "n0", (0, 1))

        def silence(self):
            return {"n0": 0.1, "n1": 9.0}

        def nodes_waiting(self):
            return {"n0": 3}

        def claim(self, lost):
            self.claims[lost] = "s"

        def claimed_by(self, lost):
            return self.claims.get(lost)

    cfg = SimpleNamespace(node_name="s", reform=SimpleNamespace(enabled=True, announce_s=5.0))
    board = Board()
    plan = WorldPlan(("n0", "n1"), ("s",), 2, "pow2")
    watch = SpareWatch(cfg, board, plan)  # type: ignore[arg-type]
    assert watch.poll() is None and board.claims == {"n1": "s"}  # claimed: the store answers next poll
    took = watch.poll()
    assert took is not None and took.plan.active == ("n0", "s") and took.plan.spares == ()
    assert board.sent == [Announcement(3, "s", (2, 3))] and watch.generation == 3


def test_a_spare_whose_claim_another_spare_holds_stands_by_again():
    from stalwart.launch.inplace.spare_takeover import SpareWatch
    from stalwart.policy.world_size import WorldPlan

    class Board(_Board):
        def silence(self):
            return {"n0": 0.1, "n1": 9.0}

        def nodes_waiting(self):
            return {"n0": 1}

        def claim(self, lost):
            pass

        def claimed_by(self, lost):
            return "other"

    cfg = SimpleNamespace(node_name="s", reform=SimpleNamespace(enabled=True, announce_s=5.0))
    watch = SpareWatch(cfg, Board(), WorldPlan(("n0", "n1"), ("s", "other"), 1, ""))  # type: ignore[arg-type]
    assert watch.poll() is None and watch.poll() is None and watch.claiming is None


def test_a_node_stops_waiting_at_once_when_the_failed_nodes_agent_refused(tmp_path):
    from stalwart.protocol import Reforming
    from stalwart.protocol.control import REFUSED

    clock, ledger = ManualClock(), RecordingLedger()
    rec, board, block = _node(tmp_path, clock, ledger)
    board.refused = ("n0", "a exception is the script's own failure")
    rec.watch(_snap_at(clock))  # even before its own ranks noticed
    assert block.reform() == REFUSED
    [why] = [e for e in ledger.of(DecisionTaken) if e.action == "in_place_skipped"]
    assert "node n0 does not re-form in place" in why.reason
    rec.tracker.observe(Reforming(2, 1, 0.01, clock.now()), clock.now())
    rec.watch(_snap_at(clock))
    assert len(ledger.of(DecisionTaken)) == 1  # refused once


def test_a_lost_node_without_a_spare_is_refused_before_the_full_bound(tmp_path):
    from stalwart.protocol import Reforming
    from stalwart.protocol.control import REFUSED

    clock, ledger = ManualClock(), RecordingLedger()
    rec, board, block = _node(tmp_path, clock, ledger)
    rec.tracker.observe(Reforming(2, 1, 0.01, clock.now()), clock.now())
    board.quiet = {"n0": 2.6}  # half the 5 s bound
    rec.watch(_snap_at(clock))
    assert block.reform() == REFUSED
    assert ("waiting", 1) not in board.sent
    [why] = [e for e in ledger.of(DecisionTaken) if e.action == "in_place_skipped"]
    assert "node n0 is lost" in why.reason and "no hot spare" in why.reason


def test_with_a_spare_a_lost_node_is_waited_for_and_the_board_told_the_ranks_wait(tmp_path):
    from stalwart.protocol import Reforming

    clock, ledger = ManualClock(), RecordingLedger()
    rec, board, block = _node(tmp_path, clock, ledger, spares=True)
    rec.tracker.observe(Reforming(2, 1, 0.01, clock.now()), clock.now())
    board.quiet = {"n0": 2.6}
    rec.watch(_snap_at(clock))
    assert block.reform() == 0 and board.sent == [("waiting", 1)]


def _no_offer(session: bool) -> tuple[InPlaceRecovery, RecordingLedger, Decision]:
    from stalwart.protocol import Hello

    clock, ledger = ManualClock(), RecordingLedger()
    tracker = ProgressTracker(ranks=RANKS, started=clock.now())
    if session:  # the ranks said Hello through the SDK, but none offers in place (no Session.run)
        for r in RANKS:
            tracker.observe(Hello(r, clock.now(), in_place=False), clock.now())
    cfg = SimpleNamespace(reform=SimpleNamespace(enabled=True))
    rec = InPlaceRecovery(
        cfg=cfg, ledger=ledger, group=None, receiver=None, block=None, tracker=tracker, num_nodes=1,
        attempt=0, clock=clock,
    )  # fmt: skip
    failure = Failure("crash", 0, 17, 2, "killed by SIGKILL")
    outcome = AttemptOutcome(AttemptStatus.FAILED, failure=failure, detected_at=clock.now())
    return rec, ledger, Decision(DecisionKind.CRASH, "rank 2 killed", outcome=outcome, rank=2)


@pytest.mark.parametrize(("session", "words"), [(True, "session.loop outside Session.run"), (False, "SDK")])
def test_a_group_that_offers_no_in_place_says_why_and_how_to_fix_it(session, words):
    rec, ledger, d = _no_offer(session)
    assert rec.consider(d, SimpleNamespace(now=0.0), 0.0) is False
    [why] = [e for e in ledger.of(DecisionTaken) if e.action == "in_place_skipped"]
    assert words in why.reason and "run the training function under Session.run" in why.reason


def test_nothing_to_fix_is_not_said_when_in_place_is_off_or_the_failure_is_the_scripts_own():
    from stalwart.policy.inplace import not_offered
    from stalwart.policy.vocabulary import FailureKind

    assert not_offered(False, FailureKind.CRASH, True) is None
    assert not_offered(True, FailureKind.EXCEPTION, True) is None
    assert not_offered(True, FailureKind.HANG, True) is not None
