"""The in-place board over a real TCPStore (launch/inplace/board.py), polled by a manual ticker on a
manual clock: every poll is a real store call made on the test's thread, so nothing sleeps and
nothing depends on timing. An announcement from one agent reaches another; a document written by
someone else (unsigned, malformed, replayed) is ignored, counted and noted once, and replaced by the
next write; a lost node's silence is measured on the manual clock; one of two spares holds a claim."""

from __future__ import annotations

from datetime import timedelta

import pytest

from stalwart.job_key import JobKey, KeySource
from stalwart.launch.clock import ManualClock
from stalwart.launch.inplace import board_state
from stalwart.launch.inplace.board import BEAT, KEY, VERSION, Announcement, ManualTicker, StoreBoard
from stalwart.launch.inplace.board_state import BoardState, Claim, Refuse

SIGNER = JobKey(b"k" * 32, KeySource.FILE).signer("job")

pytestmark = pytest.mark.integration


@pytest.fixture
def store():
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=10), wait_for_workers=False)


@pytest.fixture
def clock():
    return ManualClock()


@pytest.fixture
def ticker(clock):
    return ManualTicker(clock)


def _board(store, ticker, clock, notes=None, **kw) -> StoreBoard:
    note = notes.append if notes is not None else lambda text: None
    return StoreBoard(
        "127.0.0.1", store.port, 10.0, note, signer=SIGNER, ticker=ticker, clock=clock.monotonic, **kw
    )


def _stored(store) -> BoardState:
    got = board_state.open_state(SIGNER, f"127.0.0.1:{store.port}", store.get(KEY), 0)
    assert isinstance(got, BoardState), got
    return got


def _plant(store, raw: bytes) -> None:
    store.set(KEY, raw)
    store.add(VERSION, 1)


def test_an_announcement_from_one_agent_reaches_another(store, ticker, clock):
    a = _board(store, ticker, clock)
    b = _board(store, ticker, clock)
    ticker.tick()
    assert b.answered and b.latest() is None
    a.announce(Announcement(3, "n0", (1, 5)))
    assert b.latest() is None  # handed over: nothing is written before the next poll
    ticker.tick()
    assert a.latest() == b.latest() == Announcement(3, "n0", (1, 5))
    assert _stored(store).announcement == Announcement(3, "n0", (1, 5))
    assert _stored(store).version == 1


def test_a_document_planted_without_the_key_is_ignored_counted_and_noted_once(store, ticker, clock):
    notes: list[str] = []
    where = f"127.0.0.1:{store.port}"
    alone = board_state.write(BoardState(), (board_state.Announce(Announcement(5, "n9", (0,), 1, ("n9",))),))
    _plant(store, board_state.encode(alone))  # well formed: "train alone at world 1", but not signed
    board = _board(store, ticker, clock, notes)
    ticker.tick()
    assert board.refusals.count == 1 and board.latest() is None
    other_key = JobKey(b"o" * 32, KeySource.FILE).signer("job")  # signed, but with another job's key
    _plant(store, board_state.seal(other_key, where, alone))
    ticker.tick()
    assert board.refusals.count == 2 and board.latest() is None
    _plant(store, board_state.seal(SIGNER, "127.0.0.1:1", alone))  # this key, another round's store
    ticker.tick()
    assert board.refusals.count == 3 and board.latest() is None
    assert len([n for n in notes if "unsigned board state" in n]) == 1, notes
    board.announce(Announcement(1, "n0", (0,)))  # the next write replaces the planted bytes
    ticker.tick()
    assert _stored(store).announcement == Announcement(1, "n0", (0,))


def test_a_malformed_document_is_ignored_with_one_note(store, ticker, clock):
    notes: list[str] = []
    _plant(store, SIGNER.seal(f"board/state|127.0.0.1:{store.port}", b"not json"))
    board = _board(store, ticker, clock, notes)
    ticker.tick()
    store.add(VERSION, 1)  # read again: the same bytes are not noted or counted twice
    ticker.tick(5)
    assert board.latest() is None and len(notes) == 1 and "malformed" in notes[0], notes
    assert board.refusals.count == 1


def test_a_replayed_older_document_is_refused_and_replaced(store, ticker, clock):
    a = _board(store, ticker, clock, node="n0")
    b = _board(store, ticker, clock, node="n1")
    a.announce(Announcement(1, "n0", (0,)))
    ticker.tick()
    old = store.get(KEY)
    a.announce(Announcement(2, "n0", (1,)))
    ticker.tick()
    _plant(store, old)  # a copy of version 1, signed and bound to this round, after version 2
    ticker.tick()
    assert b.refusals.count == 1 and b.latest() == Announcement(2, "n0", (1,))
    b.waiting(3)
    ticker.tick()
    assert _stored(store).version == 3 and _stored(store).announcement == Announcement(2, "n0", (1,))


def test_a_spare_sees_a_silent_node_and_waiting_peers_and_only_one_spare_holds_a_claim(store, ticker, clock):
    n0 = _board(store, ticker, clock, node="n0")
    n1 = _board(store, ticker, clock, node="n1")
    s1 = _board(store, ticker, clock, node="s1", watch=("n0", "n1"))
    s2 = _board(store, ticker, clock, node="s2", watch=("n0", "n1"))
    ticker.tick(10)
    assert store.add(BEAT + "n1", 0) == 2  # one heartbeat every 5 polls (0.5 s)
    n1.close()  # n1's agent is gone: its heartbeat stops
    ticker.tick(10)
    assert not s1.nodes_waiting() and s1.silence() == {}  # no incident yet: no heartbeat is read
    n0.waiting(4)  # n0's ranks lost their peer: the spares start watching
    ticker.tick()
    assert s1.nodes_waiting() == {"n0": 4} and s2.nodes_waiting() == {"n0": 4}
    assert s1.silence() == {"n0": 0.0, "n1": 0.0}  # counted from the incident's start
    ticker.tick(15)  # 1.5 s on the manual clock
    silence = s1.silence()
    assert silence["n1"] == pytest.approx(1.5) and silence["n0"] < 0.5, silence  # n0 still beats
    s1.claim("n1")
    s2.claim("n1")
    ticker.tick()
    assert s1.claimed_by("n1") == s2.claimed_by("n1") == "s1"  # polled first, claimed first
    for b in (n0, s1, s2):
        b.close()


def test_a_planted_claim_or_refusal_is_replaced_by_the_next_write(store, ticker, clock):
    s1 = _board(store, ticker, clock, node="s1", watch=("n0", "n1"))
    ticker.tick()
    forged = board_state.write(BoardState(), (Claim("n1", "evil"), Refuse("n0", "stop everything")))
    _plant(store, board_state.encode(forged))
    ticker.tick()
    assert s1.claimed_by("n1") is None and s1.refusal() is None and s1.refusals.count == 1
    s1.claim("n1")
    ticker.tick()
    assert s1.claimed_by("n1") == "s1" and _stored(store).claims == {"n1": "s1"}
    assert _stored(store).refusal is None


def test_the_first_refusal_is_kept_and_seen_by_every_node(store, ticker, clock):
    a = _board(store, ticker, clock, node="n0")
    b = _board(store, ticker, clock, node="n1")
    a.refuse("rank 0 raised ValueError")
    ticker.tick()
    assert b.refusal() == ("n0", "rank 0 raised ValueError")
    b.refuse("later")
    ticker.tick(2)
    assert a.refusal() == b.refusal() == ("n0", "rank 0 raised ValueError")


def test_writers_that_race_both_land(store, ticker, clock):
    a = _board(store, ticker, clock, node="n0")
    b = _board(store, ticker, clock, node="n1")
    c = _board(store, ticker, clock, node="n2")
    ticker.tick()
    # a and b hand over before either polls: b's compare-and-set fails on a's write and is rebased
    a.waiting(2)
    b.waiting(2)
    c.offer("n2")
    ticker.tick()
    state = _stored(store)
    assert state.waiting == {"n0": 2, "n1": 2} and state.version == 3
    assert c.offers() == ("n2",) and a.offers() == ()  # a polled before c wrote
    ticker.tick()
    assert a.offers() == ("n2",) and a.refusals.count == b.refusals.count == 0


def test_an_announcement_ends_the_incident_and_the_waits_it_answered(store, ticker, clock):
    n0 = _board(store, ticker, clock, node="n0")
    s1 = _board(store, ticker, clock, node="s1", watch=("n0", "n1"))
    n0.waiting(1)
    ticker.tick()
    assert s1.nodes_waiting() == {"n0": 1} and s1.silence()
    n0.announce(Announcement(1, "n0", (0,)))
    ticker.tick()
    # answered: no node waits any more, and no heartbeat is read (a later silence is no evidence)
    assert s1.latest() == Announcement(1, "n0", (0,))
    assert s1.silence() == {} and s1.nodes_waiting() == {}
