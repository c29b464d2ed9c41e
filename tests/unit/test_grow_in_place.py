"""A group that shrank in place grows back in place when a node returns, the agents' side over fakes
(stalwart.launch.fakes, a board as an arriving agent sees it): the arriving agent's offer
(launch/inplace/rejoin.py), the first node's invitation and announcement (launch/inplace/nodes.py),
the runner's take-over path before the first rendezvous, where the running round's worker store is
read from (launch/rendezvous/arrival.py) and the console's line. Manual clocks throughout: nothing
sleeps. The pure policies are test_grow_policy.py; the board over a real TCPStore and a newcomer
rank's join through a real store, tests/integration/test_grow_board_store.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from stalwart.events import DecisionTaken, ReformedInPlace
from stalwart.exit_codes import EXIT_OK
from stalwart.job_key import JobKey, KeySource
from stalwart.launch.clock import ManualClock
from stalwart.launch.decision import AttemptOutcome
from stalwart.launch.fakes import FakeRendezvous, RecordingBoard, RecordingLedger, ScriptedWorkers
from stalwart.launch.inplace.board import POLL_S, Announcement
from stalwart.launch.inplace.recovery import InPlaceRecovery
from stalwart.launch.ports import Round
from stalwart.launch.progress import ProgressTracker
from stalwart.policy.job import AttemptStatus, End, Replace, TookOver
from stalwart.policy.world_size import SizeRule, WorldPlan
from stalwart.protocol import Reformed, Reforming

ANY = SizeRule("multiple", 1)

KEY = JobKey(b"k" * 32, KeySource.FILE)

# --- the arriving agent: rejoin -----------------------------------------------------------------------

WORKERS = ("10.0.0.7", 29511)
SHRUNK = Announcement(1, "n0", (), 4, ("n0", "n1"))
INVITED = Announcement(2, "n0", (4, 5), 6, ("n0", "n1", "n2"))


class _ArrivalBoard:
    """A board as an arriving agent sees it: answers, invitations and withdrawals on the manual clock."""

    def __init__(
        self,
        clock: ManualClock,
        *,
        answers_at: float | None = None,
        group: Announcement | None = None,
        invitation: Announcement | None = None,
        invites_at: float | None = None,
        invites_on_withdraw: bool = False,
        stale: Announcement | None = None,
    ) -> None:
        self.clock, self.answers_at, self._group, self.stale = clock, answers_at, group, stale
        self.invitation, self.invites_at, self.invites_on_withdraw = (
            invitation,
            invites_at,
            invites_on_withdraw,
        )
        self.calls: list[object] = []

    @property
    def answered(self) -> bool:
        return self.answers_at is not None and self.clock.monotonic() >= self.answers_at

    def group(self):
        return self._group

    def offer(self, node: str) -> None:
        self.calls.append(("offer", node, self.clock.monotonic()))

    def withdraw(self, node: str) -> None:
        self.calls.append(("withdraw", node, self.clock.monotonic()))
        if self.invites_on_withdraw:  # the first node's invitation crossed the withdrawal
            self.invites_at = self.clock.monotonic()

    def invited(self):
        if self.invites_at is None or self.clock.monotonic() < self.invites_at:
            return self.stale  # what an earlier, given-up invitation left in the store (None: nothing)
        return self.invitation

    def close(self) -> None:
        self.calls.append("close")


def _arriving(node: str = "n2", max_nodes: int = 3, enabled: bool = True):
    return SimpleNamespace(
        node_name=node,
        nproc_per_node=2,
        max_nodes=max_nodes,
        reform=SimpleNamespace(enabled=enabled, announce_s=5.0),
        rendezvous=SimpleNamespace(store_timeout_s=10.0),
    )


def _find(board: _ArrivalBoard, clock: ManualClock, cfg=None, where=WORKERS):
    from stalwart.launch.inplace.rejoin import find_place

    notes: list[str] = []
    rendezvous = SimpleNamespace(workers_elsewhere=lambda: where)
    got = find_place(cfg or _arriving(), rendezvous, clock, notes.append, board_for=lambda: board)
    return got, notes


def test_no_running_round_means_no_board_and_no_place():
    clock = ManualClock(0.0)
    opened: list[int] = []
    from stalwart.launch.inplace.rejoin import find_place

    rendezvous = SimpleNamespace(workers_elsewhere=lambda: None)
    assert find_place(_arriving(), rendezvous, clock, print, board_for=lambda: opened.append(1)) is None
    assert opened == [] and clock.now() == 0.0


def test_a_board_that_never_answers_gives_up_after_the_probe_bound():
    clock = ManualClock(0.0)
    board = _ArrivalBoard(clock)
    got, notes = _find(board, clock)
    assert got is None and notes == [] and board.calls == ["close"]
    assert 5.0 <= clock.now() <= 5.0 + POLL_S + 1e-9  # min(5 s, the store timeout / 2), then no more


def test_a_group_that_never_resized_is_joined_through_the_rendezvous_without_a_note():
    clock = ManualClock(0.0)
    board = _ArrivalBoard(clock, answers_at=0.3)
    got, notes = _find(board, clock)
    assert got is None and notes == [] and board.calls == ["close"]
    assert clock.now() == pytest.approx(0.3)  # waited for the first answer only


@pytest.mark.parametrize(
    ("cfg", "why"),
    [
        (_arriving(node="n1"), "node n1 is already in the running group: joining the rendezvous"),
        (
            _arriving(max_nodes=2),
            "the running group already has --nnodes MAX 2 nodes: joining the rendezvous",
        ),
        (_arriving(enabled=False), "in-place recovery is off (--no-in-place): joining the rendezvous"),
    ],
)
def test_a_node_that_does_not_offer_says_why_and_offers_nothing(cfg, why):
    clock = ManualClock(0.0)
    board = _ArrivalBoard(clock, answers_at=0.0, group=SHRUNK)
    got, notes = _find(board, clock, cfg)
    assert got is None and notes == [why] and board.calls == ["close"]


def test_an_invited_node_gets_its_place_in_the_invitations_generation():
    clock = ManualClock(0.0)
    board = _ArrivalBoard(clock, answers_at=0.0, group=SHRUNK, invitation=INVITED, invites_at=1.0)
    got, notes = _find(board, clock)
    assert got is not None
    active = ("n0", "n1", "n2")
    assert got.plan == WorldPlan(active, (), 2, got.reason)
    assert got.met == Round(2, active, *WORKERS) and got.generation == 2
    assert got.reason == (
        "node n0 took node n2 back into the group in place: its ranks start as group rank 2 of 3 "
        "(6 processes) in generation 2, with the live state from a replica"
    )
    assert notes == [
        "the running group has 2 of at most 3 nodes (4 processes): node n2 offers to take a free place "
        "in place"
    ]
    assert board.calls == [("offer", "n2", 0.0), "close"]  # no withdrawal
    assert 1.0 <= clock.now() <= 1.0 + POLL_S + 1e-9  # taken as soon as it was seen


def test_an_invitation_left_from_an_earlier_given_up_grow_does_not_take_the_node_in():
    clock = ManualClock(0.0)
    stale = Announcement(2, "n0", (4, 5), 6, ("n0", "n1", "n2"))  # n2's earlier try, given up
    fresh = Announcement(3, "n0", (4, 5), 6, ("n0", "n1", "n2"))
    board = _ArrivalBoard(clock, answers_at=0.0, group=SHRUNK, invitation=fresh, invites_at=2.0, stale=stale)
    got, _ = _find(board, clock)
    assert got is not None and got.generation == 3 and clock.now() >= 2.0, got


@pytest.mark.parametrize(
    "invitation",
    [
        Announcement(1, "n0", (4, 5), 6, ("n0", "n1", "n2")),  # not newer than the group record
        Announcement(2, "n0", (4, 5), 6, ("n0", "n1", "n3")),  # another node's
        Announcement(2, "n0", (4, 5)),  # no group in it
        None,
    ],
)
def test_a_node_never_invited_withdraws_its_offer_and_joins_the_rendezvous(invitation):
    clock = ManualClock(0.0)
    board = _ArrivalBoard(clock, answers_at=0.0, group=SHRUNK, invitation=invitation, invites_at=0.0)
    got, notes = _find(board, clock)
    assert got is None
    assert notes[-1] == "the group did not take node n2 in within 5s: joining the rendezvous"
    offered, withdrew, closed = board.calls
    assert offered[:2] == ("offer", "n2") and withdrew[:2] == ("withdraw", "n2") and closed == "close"
    assert 5.0 <= withdrew[2] <= 5.0 + POLL_S + 1e-9  # after the announce bound, not before


def test_a_node_invited_as_it_withdrew_still_takes_its_place():
    clock = ManualClock(0.0)
    board = _ArrivalBoard(clock, answers_at=0.0, group=SHRUNK, invitation=INVITED, invites_on_withdraw=True)
    got, notes = _find(board, clock)
    assert got is not None and got.generation == 2 and got.met.group_rank == 2
    assert [c[0] for c in board.calls[:2]] == ["offer", "withdraw"] and board.calls[-1] == "close"
    assert not any("did not take" in n for n in notes)


# --- the first node: invite, then announce ------------------------------------------------------------


_GrowBoard = RecordingBoard


def _group_node(
    tmp_path,
    clock: ManualClock,
    ledger: RecordingLedger,
    *,
    node: str = "n0",
    ranks=(0, 1),
    active=("n0", "n1"),
):
    """A node of a group shrunk in place to n0, n1 (two ranks each), which may grow back to three."""
    from stalwart.protocol import control

    ctl = tmp_path / "ctl.bin"
    control.create(ctl, slots=len(ranks))
    block = control.ControlBlock(ctl, writable=True)
    board = _GrowBoard()
    cfg = SimpleNamespace(
        reform=SimpleNamespace(enabled=True, announce_s=5.0, timeout_s=30.0),
        nproc_per_node=len(ranks),
        min_nodes=1,
        max_nodes=3,
        size_rule=ANY,
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
        xids=lambda: (),
    )
    return rec, board, block


def _snap(clock: ManualClock):
    return SimpleNamespace(now=clock.now(), stop_requested_at=None)


def _actions(ledger: RecordingLedger) -> list[str]:
    return [e.action for e in ledger.of(DecisionTaken)]


GROWN = Announcement(1, "n0", (4, 5), 6, ("n0", "n1", "n2"))


def test_the_first_node_invites_an_offered_node_and_re_forms_only_once_its_ranks_are_ready(tmp_path):
    clock, ledger = ManualClock(), RecordingLedger()
    rec, board, block = _group_node(tmp_path, clock, ledger)
    rec.watch(_snap(clock))
    assert board.sent == [] and ledger.events == []  # no offer: nothing to do
    board.offered = ("n2",)
    rec.watch(_snap(clock))
    assert board.sent == [("invite", GROWN)]  # invited, nothing announced or published yet
    assert _actions(ledger) == ["grow_in_place"]
    assert "node n2 offered to return" in ledger.of(DecisionTaken)[0].reason
    assert (block.reform(), block.place()) == (0, None)  # the group trains on
    assert (rec.generation, rec.world_size, rec.active, rec.state.since) == (0, 4, ("n0", "n1"), None)
    clock.advance(10.0)
    board.readied = {"n2": 0}  # ready for another generation: not this invitation
    rec.watch(_snap(clock))
    assert board.sent == [("invite", GROWN)] and _actions(ledger) == ["grow_in_place"]

    board.readied = {"n2": 1}
    rec.watch(_snap(clock))
    assert board.sent == [("invite", GROWN), ("watch", ("n2",)), ("group", GROWN), GROWN]
    assert (block.reform(), block.place()) == (1, (0, 6))
    assert (rec.generation, rec.world_size, rec.num_nodes, rec.active) == (1, 6, 3, ("n0", "n1", "n2"))
    assert rec.state.invitation is None and rec.state.since == clock.now()
    assert _actions(ledger) == ["grow_in_place"]  # the announcement is no second decision

    for r in (0, 1):
        rec.tracker.observe(Reforming(r, 1, 0.01, clock.now()), clock.now())
    for r in (0, 1):
        clock.advance(0.5)
        rec.watch(_snap(clock))
        assert not ledger.of(ReformedInPlace)  # not before every local rank joined
        rec.tracker.observe(
            Reformed(r, 1, 17, 1024 * r, {"rendezvous": 0.2, "transfer": 0.1}, clock.now()), clock.now()
        )
    rec.watch(_snap(clock))
    rec.watch(_snap(clock))
    [done] = ledger.of(ReformedInPlace)
    assert (done.generation, done.ranks, done.world_size, done.grown_from, done.shrunk_from) == (
        1,
        (4, 5),
        6,
        4,
        0,
    )
    assert (done.step, done.bytes_moved, done.lost_steps) == (17, 1024, 0)
    assert done.phases == {"join": pytest.approx(0.5), "rendezvous": 0.2, "transfer": 0.1}
    assert rec.completed == 0 and rec.state.resized is None  # a grow recovers no failure
    rec.watch(_snap(clock))  # the offer still stands, but n2 is in the group now: no second grow
    assert _actions(ledger) == ["grow_in_place"] and len(ledger.of(ReformedInPlace)) == 1


def test_an_invitation_whose_newcomer_is_not_ready_in_time_is_given_up(tmp_path):
    clock, ledger = ManualClock(), RecordingLedger()
    rec, board, block = _group_node(tmp_path, clock, ledger)
    board.offered = ("n2",)
    rec.watch(_snap(clock))
    clock.advance(29.9)
    rec.watch(_snap(clock))
    assert _actions(ledger) == ["grow_in_place"] and rec.state.invitation is not None
    clock.advance(0.1)
    rec.watch(_snap(clock))
    assert _actions(ledger) == ["grow_in_place", "grow_in_place_failed"]
    assert ledger.of(DecisionTaken)[-1].reason == (
        "the ranks of node n2 were not ready to join generation 1 within 30s: the group goes on at 4 processes"
    )
    assert rec.state.invitation is None and board.sent == [("invite", GROWN)]
    assert (block.reform(), rec.generation, rec.world_size) == (0, 0, 4)


def test_a_given_up_offer_is_not_invited_again_until_the_node_offers_anew_past_a_stale_readiness(tmp_path):
    clock, ledger = ManualClock(), RecordingLedger()
    rec, board, block = _group_node(tmp_path, clock, ledger)
    board.offered = ("n2",)
    rec.watch(_snap(clock))
    clock.advance(30.0)
    rec.watch(_snap(clock))
    assert _actions(ledger) == ["grow_in_place", "grow_in_place_failed"]
    board.readied = {"n2": 1}  # the given-up newcomer's ranks said so too late: stale from here on
    clock.advance(1.0)
    rec.watch(_snap(clock))  # its offer still stands in the store, but it is the same offer
    assert _actions(ledger) == ["grow_in_place", "grow_in_place_failed"] and rec.state.invitation is None
    board.seqs = {"n2": 2}  # n2's agent started again and offered anew
    rec.watch(_snap(clock))
    assert _actions(ledger)[-1] == "grow_in_place" and rec.state.invitation is not None
    assert rec.state.invitation.a.generation == 2  # past the given-up invitation of generation 1
    rec.watch(_snap(clock))
    assert block.reform() == 0, "a readiness for the given-up generation started the re-formation"
    board.readied = {"n2": 2}
    rec.watch(_snap(clock))
    assert block.reform() == 2 and rec.state.invitation is None


def test_a_local_rank_losing_a_peer_during_an_invitation_cancels_it(tmp_path):
    clock, ledger = ManualClock(), RecordingLedger()
    rec, board, block = _group_node(tmp_path, clock, ledger)
    board.offered = ("n2",)
    rec.watch(_snap(clock))
    rec.tracker.observe(Reforming(0, 1, 0.01, clock.now()), clock.now())
    board.readied = {"n2": 1}  # too late: the failure came first
    rec.watch(_snap(clock))
    assert _actions(ledger) == ["grow_in_place", "grow_in_place_failed"]
    assert (
        ledger.of(DecisionTaken)[-1].reason == "a failure during the grow: the group goes on at 4 processes"
    )
    assert rec.state.invitation is None and GROWN not in board.sent and ("group", GROWN) not in board.sent
    assert board.sent[-1] == ("waiting", 1) and block.reform() == 0  # the usual wait for an announcement


def test_another_nodes_announcement_during_an_invitation_cancels_it_and_is_joined(tmp_path):
    clock, ledger = ManualClock(), RecordingLedger()
    rec, board, block = _group_node(tmp_path, clock, ledger)
    board.offered = ("n2",)
    rec.watch(_snap(clock))
    board.seen = Announcement(1, "n1", (2,))  # n1 replaced a rank of its own
    rec.watch(_snap(clock))
    assert _actions(ledger) == ["grow_in_place", "grow_in_place_failed", "joined_in_place"]
    assert (block.reform(), block.place(), rec.world_size) == (1, None, 4)


def test_a_node_that_is_not_first_never_invites_and_joins_the_grow_in_its_place(tmp_path):
    clock, ledger = ManualClock(), RecordingLedger()
    rec, board, block = _group_node(tmp_path, clock, ledger, node="n1", ranks=(2, 3))
    board.offered = ("n2",)
    rec.watch(_snap(clock))
    assert board.sent == [] and ledger.events == []
    board.seen = GROWN
    rec.watch(_snap(clock))
    assert (block.reform(), block.place()) == (1, (2, 6))
    assert (rec.world_size, rec.active) == (6, ("n0", "n1", "n2"))
    [joined] = ledger.of(DecisionTaken)
    assert joined.action == "joined_in_place"
    assert joined.reason.startswith("node n0 grew the group back in place to 6 processes")


# --- the runner: a place before the first rendezvous --------------------------------------------------


def _runner(rounds, workers, node: str = "n2"):
    from stalwart.launch.fakes import FakeGate, FakeRunFiles
    from stalwart.launch.runner import JobRunner
    from stalwart.policy import job
    from stalwart.policy.job import JobSpec

    ledger = RecordingLedger(run_id="r", node=node)
    rdzv = FakeRendezvous(rounds)
    r = JobRunner(
        state=job.initial(JobSpec(node=node, nproc_per_node=2, max_nodes=3, size_rule=ANY)),
        rendezvous=rdzv,
        workers=workers,
        files=FakeRunFiles(),
        ledger=ledger,
        clock=ManualClock(1_000_000.0),
        signal=lambda: None,
        gate=FakeGate(),
        on_attempt=lambda attempt: setattr(ledger, "attempt", attempt),
    )
    return r, rdzv, ledger


PLACE_PLAN = WorldPlan(("n0", "n1", "n2"), (), 2, "taken back in place")


def test_a_node_given_a_place_runs_its_first_attempt_on_that_plan_without_a_rendezvous():
    back = (TookOver(PLACE_PLAN, "node n0 took node n2 back"), Round(2, PLACE_PLAN.active, *WORKERS))
    w = ScriptedWorkers([AttemptOutcome(AttemptStatus.SUCCEEDED)], returns=back)
    r, rdzv, ledger = _runner([], w)  # no round: a rendezvous would fail the job
    assert r.run() == EXIT_OK
    assert w.started == [(0, ("n0", "n1", "n2"))] and rdzv.met == []
    assert [type(d) for d in r.decided] == [Replace, End]
    [took] = ledger.of(DecisionTaken)
    assert (took.action, took.reason) == ("take_over", "node n0 took node n2 back")


def test_the_place_is_looked_for_only_before_the_first_rendezvous():
    from stalwart.policy.restart_policy import Failure
    from stalwart.policy.vocabulary import FailureKind

    back = (TookOver(PLACE_PLAN, "node n0 took node n2 back"), Round(2, PLACE_PLAN.active, *WORKERS))
    crash = AttemptOutcome(AttemptStatus.FAILED, Failure(FailureKind.CRASH, 0, 3, 4, "killed by SIGKILL"))
    w = ScriptedWorkers([crash, AttemptOutcome(AttemptStatus.SUCCEEDED)], returns=back)
    r, rdzv, ledger = _runner([("n0", "n1", "n2")], w)
    assert r.run() == EXIT_OK
    assert w.started == [(0, ("n0", "n1", "n2")), (1, ("n0", "n1", "n2"))]
    assert rdzv.met == [("n0", "n1", "n2")]  # the restart met the others as before
    assert [e.action for e in ledger.of(DecisionTaken)][:2] == ["take_over", "restart"]


# --- where the running round's worker store is --------------------------------------------------------


class _Store:
    def __init__(self) -> None:
        self.kv: dict[str, bytes] = {}

    def set(self, key: str, value) -> None:
        self.kv[key] = value.encode() if isinstance(value, str) else value

    def check(self, keys) -> bool:
        return all(k in self.kv for k in keys)

    def get(self, key: str) -> bytes:
        return self.kv[key]


def test_the_worker_store_mark_round_trips():
    from stalwart.launch.rendezvous.arrival import mark_workers, read_workers

    store = _Store()
    assert read_workers(store, "r1") is None  # no round recorded one
    mark_workers(store, "r1", "10.0.0.7", 29511)
    assert read_workers(store, "r1") == ("10.0.0.7", 29511)
    assert read_workers(store, "r2") is None  # another run's


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"\xff\xfe",
        b"[1, 2]",
        b'"10.0.0.7:29511"',
        b'{"addr": "10.0.0.7"}',
        b'{"port": 29511}',
        b'{"addr": "", "port": 29511}',
        b'{"addr": 7, "port": 29511}',
        b'{"addr": "10.0.0.7", "port": 0}',
        b'{"addr": "10.0.0.7", "port": 65536}',
        b'{"addr": "10.0.0.7", "port": -1}',
        b'{"addr": "10.0.0.7", "port": "29511"}',
        b'{"addr": "10.0.0.7", "port": 29511.0}',
        b'{"addr": "10.0.0.7", "port": true}',
    ],
)
def test_a_worker_store_mark_that_is_not_a_record_reads_as_none(raw):
    from stalwart.launch.rendezvous.arrival import WORKERS_KEY, read_workers

    store = _Store()
    store.set(f"{WORKERS_KEY}/r1", raw)
    assert read_workers(store, "r1") is None


# --- the console --------------------------------------------------------------------------------------


def _grown(ranks: tuple[int, ...]) -> ReformedInPlace:
    return ReformedInPlace(
        ts=1.0,
        generation=2,
        ranks=ranks,
        step=40,
        lost_steps=0,
        bytes_moved=3 * 2**20,
        state_bytes=3 * 2**20,
        phases={},
        world_size=6,
        grown_from=4,
        node="n0",
    )


def test_the_console_says_the_group_grew_back_in_place():
    from stalwart.launch.console import resized_line

    assert resized_line("12:00:01", _grown((4, 5))) == (
        "12:00:01 [green]grew back in place[/] from 4 to 6 processes: the ranks kept their processes and "
        "a replica sent new rank 4-5 the live state after step 40 (3.0 MiB)"
    )
    assert "sent new rank 5 the live state" in resized_line("t", _grown((5,)))


def test_the_console_and_the_ledger_carry_a_grow():
    import io

    from stalwart.events import decode, encode
    from stalwart.launch.console import RunConsole

    ev = _grown((4, 5))
    live = io.StringIO()
    RunConsole(stream=live).event(ev)
    assert "grew back in place from 4 to 6 processes" in live.getvalue()
    assert decode(*encode(ev)) == ev
    old = {k: v for k, v in ev.to_payload().items() if k != "grown_from"}
    before = decode("ReformedInPlace", old)  # a ledger written before the field reads as no grow
    assert isinstance(before, ReformedInPlace) and before.grown_from == 0
    assert json.loads(json.dumps(ev.to_payload()))["grown_from"] == 4


def test_a_newcomer_tells_the_first_node_once_all_of_its_ranks_are_about_to_join(tmp_path):
    clock, ledger = ManualClock(), RecordingLedger()
    rec, board, _ = _group_node(tmp_path, clock, ledger, node="n2", ranks=(4, 5), active=GROWN.active)
    rec.start_joining(1, clock.now(), newcomer=True)  # its ranks started in the invited generation
    rec.tracker.observe(Reforming(4, 1, 0.0, clock.now()), clock.now())
    rec.watch(_snap(clock))
    assert ("ready", 1) not in board.sent  # one of its two ranks is not there yet
    rec.tracker.observe(Reforming(5, 0, 0.0, clock.now()), clock.now())  # an older generation's
    rec.watch(_snap(clock))
    assert ("ready", 1) not in board.sent
    rec.tracker.observe(Reforming(5, 1, 0.0, clock.now()), clock.now())
    rec.watch(_snap(clock))
    rec.watch(_snap(clock))
    assert board.sent.count(("ready", 1)) == 1, board.sent  # said once
    assert not [a for a in _actions(ledger) if a in ("in_place_skipped", "grow_in_place")]


def test_a_node_lost_during_an_invitation_cancels_it_and_the_shrink_takes_a_generation_past_it(tmp_path):
    clock, ledger = ManualClock(), RecordingLedger()
    rec, board, block = _group_node(tmp_path, clock, ledger)
    board.offered = ("n2",)
    rec.watch(_snap(clock))
    assert rec.state.invitation is not None and rec.state.invitation.a.generation == 1
    rec.tracker.observe(Reforming(0, 1, 0.01, clock.now()), clock.now())  # n1 went silent: a peer lost
    board.quiet = {"n1": 3.0}  # past half of the 5 s bound
    rec.watch(_snap(clock))
    assert _actions(ledger) == ["grow_in_place", "grow_in_place_failed", "shrink_in_place"], _actions(ledger)
    assert "a node was lost during the grow" in ledger.of(DecisionTaken)[1].reason
    [shrunk] = [a for a in board.sent if isinstance(a, Announcement)]
    assert (shrunk.generation, shrunk.world_size, shrunk.active) == (2, 2, ("n0",)), shrunk
    assert rec.state.invitation is None and block.reform() == 2


def test_an_agent_starting_before_the_c10d_store_listens_does_not_open_a_store_client():
    """At a job's start the c10d endpoint may not listen yet (this agent may be its host): a store
    client would retry until its timeout, so nothing is asked; once it listens, the record is read."""
    import socket

    from stalwart.launch.rendezvous.node_rendezvous import NodeRendezvous

    asked: list[str] = []

    def store_for(cfg, timeout_s):  # the store client the rendezvous is given, in place of a TCPStore
        asked.append(cfg.rendezvous.endpoint)
        key = f"stalwart/workers/{cfg.rendezvous.id}"
        return _Marks({key: KEY.signer("r").seal(f"{key}|", b'{"addr": "10.0.0.7", "port": 4242}')})

    with socket.socket() as free:  # a port nothing listens on
        free.bind(("127.0.0.1", 0))
        idle = free.getsockname()[1]
    cfg = SimpleNamespace(
        use_c10d=True,
        max_nodes=3,
        reform=SimpleNamespace(enabled=True),
        rendezvous=SimpleNamespace(
            backend="c10d", endpoint=f"127.0.0.1:{idle}", id="r", store_timeout_s=30.0
        ),
    )
    assert NodeRendezvous(cfg, key=KEY, store_for=store_for).workers_elsewhere() is None and asked == []
    with socket.create_server(("127.0.0.1", 0)) as server:
        cfg.rendezvous.endpoint = f"127.0.0.1:{server.getsockname()[1]}"
        got = NodeRendezvous(cfg, key=KEY, store_for=store_for).workers_elsewhere()
        assert got == ("10.0.0.7", 4242) and len(asked) == 1


class _Marks:
    """The rendezvous store's ``check``/``get`` over a dict."""

    def __init__(self, keys: dict[str, bytes]) -> None:
        self.keys = keys

    def check(self, keys: list[str]) -> bool:
        return all(k in self.keys for k in keys)

    def get(self, key: str) -> bytes:
        return self.keys[key]


def test_a_newcomer_records_its_join_but_counts_no_failure_recovered(tmp_path):
    clock, ledger = ManualClock(), RecordingLedger()
    rec, board, _ = _group_node(tmp_path, clock, ledger, node="n2", ranks=(4, 5), active=GROWN.active)
    rec.start_joining(1, clock.now(), newcomer=True)
    for r in (4, 5):
        rec.tracker.observe(
            Reformed(r, 1, 40, 1000, {"rendezvous": 0.1, "transfer": 0.02}, clock.now()), clock.now()
        )
    rec.watch(_snap(clock))
    [joined] = ledger.of(ReformedInPlace)
    assert joined.ranks == (4, 5) and joined.bytes_moved == 2000 and joined.generation == 1
    assert rec.completed == 0  # its verdict counts no failure: it recovered none
