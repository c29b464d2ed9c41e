"""The in-place announcement board over a real TCPStore (launch/reform_board.py): an announcement
from one agent reaches another; a malformed value written by someone else is ignored with one
note."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from stalwart.job_key import JobKey, KeySource, Opened
from stalwart.launch.reform_board import KEY, Announcement, StoreBoard

SIGNER = JobKey(b"k" * 32, KeySource.FILE).signer("job")

pytestmark = pytest.mark.integration


@pytest.fixture
def store():
    from torch.distributed import TCPStore

    master = TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=10), wait_for_workers=False)
    yield master


def _until(pred, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError("the board did not see it in time")


def test_an_announcement_from_one_agent_reaches_another(store):
    a = StoreBoard("127.0.0.1", store.port, 10.0, signer=SIGNER)
    b = StoreBoard("127.0.0.1", store.port, 10.0, signer=SIGNER)
    try:
        assert b.latest() is None
        a.announce(Announcement(3, "n0", (1, 5)))
        got = _until(b.latest)
        assert got == Announcement(3, "n0", (1, 5))
        stored = SIGNER.open(f"board/announce|127.0.0.1:{store.port}", store.get(KEY))
        assert isinstance(stored, Opened) and Announcement.decode(stored.payload) == got
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"\xff\xfe", "not JSON"),
        (b"[1, 2]", "not an object"),
        (b'{"generation": 0, "node": "n0", "ranks": []}', "not a positive integer"),
        (b'{"generation": true, "node": "n0", "ranks": []}', "not a positive integer"),
        (b'{"generation": 2, "node": "", "ranks": []}', "node is not a name"),
        (b'{"generation": 2, "node": "n0", "ranks": [-1]}', "not a list of ranks"),
    ],
)
def test_a_malformed_announcement_is_refused_with_what_is_wrong(raw, why):
    with pytest.raises(ValueError, match=why):
        Announcement.decode(raw)


def test_an_announcement_planted_without_the_key_is_ignored_counted_and_noted_once(store):
    notes: list[str] = []
    planted = Announcement(5, "n9", (0,), 1, ("n9",)).encode()  # well formed: "train alone at world 1"
    store.set(KEY, planted)
    board = StoreBoard("127.0.0.1", store.port, 10.0, notes.append, signer=SIGNER)
    other_key = JobKey(b"o" * 32, KeySource.FILE).signer("job")  # signed, but with another job's key
    try:
        _until(lambda: board.refusals.count >= 1)
        store.set(KEY, other_key.seal(f"board/announce|127.0.0.1:{store.port}", planted))
        store.add("stalwart/inplace/version", 1)
        _until(lambda: board.refusals.count >= 2)
        assert board.latest() is None
        assert len([n for n in notes if "unsigned in-place announcement" in n]) == 1, notes
    finally:
        board.close()


def test_a_malformed_value_in_the_store_is_ignored_with_one_note(store):
    notes: list[str] = []
    store.set(KEY, SIGNER.seal(f"board/announce|127.0.0.1:{store.port}", b"not json"))
    board = StoreBoard("127.0.0.1", store.port, 10.0, notes.append, signer=SIGNER)
    try:
        _until(lambda: notes)
        time.sleep(0.5)  # several more polls of the same value
        assert board.latest() is None and len(notes) == 1 and "malformed" in notes[0]
    finally:
        board.close()


def test_a_spare_sees_a_silent_node_and_waiting_peers_and_only_one_spare_holds_a_claim(store):
    n0 = StoreBoard("127.0.0.1", store.port, 10.0, node="n0", signer=SIGNER)
    n1 = StoreBoard("127.0.0.1", store.port, 10.0, node="n1", signer=SIGNER)
    s1 = StoreBoard("127.0.0.1", store.port, 10.0, node="s1", watch=("n0", "n1"), signer=SIGNER)
    s2 = StoreBoard("127.0.0.1", store.port, 10.0, node="s2", watch=("n0", "n1"), signer=SIGNER)
    try:
        _until(lambda: store.add("stalwart/inplace/beat/n1", 0) > 1)
        n1.close()  # n1's agent is gone: its heartbeat stops
        time.sleep(1.0)
        assert not s1.nodes_waiting() and s1.silence() == {}  # no incident yet: no heartbeat is read
        n0.waiting(4)  # n0's ranks lost their peer: the spares start watching
        assert _until(lambda: s1.nodes_waiting()) == {"n0": 4}
        time.sleep(1.5)
        silence = s1.silence()
        assert silence["n1"] > silence["n0"] + 0.5, silence  # n0 still beats, n1 does not
        s1.claim("n1")
        s2.claim("n1")
        assert _until(lambda: s1.claimed_by("n1")) == _until(lambda: s2.claimed_by("n1"))
        assert s1.claimed_by("n1") in ("s1", "s2")
    finally:
        for b in (n0, n1, s1, s2):
            b.close()


def test_the_first_refusal_is_kept_and_seen_by_every_node(store):
    a = StoreBoard("127.0.0.1", store.port, 10.0, node="n0", signer=SIGNER)
    b = StoreBoard("127.0.0.1", store.port, 10.0, node="n1", signer=SIGNER)
    try:
        a.refuse("rank 0 raised ValueError")
        assert _until(b.refusal) == ("n0", "rank 0 raised ValueError")
        b.refuse("later")
        time.sleep(0.5)
        assert a.refusal() == ("n0", "rank 0 raised ValueError")
    finally:
        a.close()
        b.close()


def test_an_announcement_ends_the_incident_and_the_waits_it_answered(store):
    n0 = StoreBoard("127.0.0.1", store.port, 10.0, node="n0", signer=SIGNER)
    s1 = StoreBoard("127.0.0.1", store.port, 10.0, node="s1", watch=("n0", "n1"), signer=SIGNER)
    try:
        n0.waiting(1)
        assert _until(lambda: s1.nodes_waiting()) == {"n0": 1} and s1.silence()
        n0.announce(Announcement(1, "n0", (0,)))
        _until(s1.latest)
        # answered: no node waits any more, and no heartbeat is read (a later silence is no evidence)
        assert _until(lambda: s1.silence() == {}) and s1.nodes_waiting() == {}
    finally:
        n0.close()
        s1.close()
