"""The sealed rendezvous backend's backoff after a lost compare-and-set (launch/rendezvous/sealed.py):
the wait grows with losses in a row and is reset by a write that holds, torch's next attempt starts
from the state as stored after the wait, and what is read then is held to the same seal and replay
rules as any read."""

from __future__ import annotations

import pickle
import threading

from memory_backend import Bomb, MemoryBackend
from stalwart.job_key import JobKey, KeySource, Refusals
from stalwart.launch.rendezvous import sealed as sealed_mod
from stalwart.launch.rendezvous.sealed import BACKOFF_CAP_S, BACKOFF_S, SealedBackend

KEY = JobKey(b"k" * 32, KeySource.FILE)


def _pair(sleeps: list[float]) -> tuple[MemoryBackend, SealedBackend, SealedBackend]:
    """A store and two agents' backends; the second one's waits recorded (drawn at the window's top)."""
    inner = MemoryBackend()
    signer = KEY.signer("job")
    rival = SealedBackend(inner, signer, Refusals())
    mine = SealedBackend(inner, signer, Refusals(), sleep=sleeps.append, draw=lambda: 1.0)
    return inner, rival, mine


def test_the_wait_doubles_with_each_loss_in_a_row_up_to_the_cap_and_a_held_write_resets_it():
    sleeps: list[float] = []
    inner, rival, mine = _pair(sleeps)
    rival.set_state(pickle.dumps({"n": 0}), None)
    stale = None  # every write of mine is on a token the rival has already moved past
    losses = 12
    for i in range(losses):
        rival.set_state(pickle.dumps({"n": i + 1}), inner.version)
        state, _, written = mine.set_state(pickle.dumps({"mine": i}), stale)
        assert not written and pickle.loads(state) == {"n": i + 1}
    assert sleeps == [min(BACKOFF_CAP_S, BACKOFF_S * 2**i) for i in range(losses)]
    assert sleeps[-1] == BACKOFF_CAP_S
    _, _, written = mine.set_state(pickle.dumps({"mine": "held"}), inner.version)
    assert written and mine.losses == 0
    rival.set_state(pickle.dumps({"n": "again"}), inner.version)
    mine.set_state(pickle.dumps({"mine": "lost"}), None)
    assert sleeps[-1] == BACKOFF_S  # a fresh first loss: the smallest window again


def test_after_the_wait_torch_gets_the_state_as_stored_then_so_its_next_write_holds():
    sleeps: list[float] = []
    inner, rival, mine = _pair(sleeps)
    rival.set_state(pickle.dumps({"n": 1}), None)

    def rival_writes_while_mine_waits(seconds: float) -> None:
        sleeps.append(seconds)
        rival.set_state(pickle.dumps({"n": 2}), inner.version)

    mine._sleep = rival_writes_while_mine_waits
    state, token, written = mine.set_state(pickle.dumps({"mine": 1}), None)
    assert not written and pickle.loads(state) == {"n": 2} and token == inner.version
    state, token, written = mine.set_state(pickle.dumps({"mine": 2}), token)
    assert written and token == inner.version and len(sleeps) == 1


def test_bytes_planted_during_the_wait_are_never_handed_to_torch():
    notes: list[str] = []
    inner, rival, _ = _pair([])
    rival.set_state(pickle.dumps({"n": 1}), None)

    def plant(seconds: float) -> None:
        inner.value, inner.version = pickle.dumps(Bomb()), inner.version + 1

    mine = SealedBackend(inner, KEY.signer("job"), Refusals(notes.append), sleep=plant, draw=lambda: 1.0)
    state, token, written = mine.set_state(pickle.dumps({"mine": 1}), None)
    assert not written and pickle.loads(state) == {"n": 1}  # the last authentic state, not the bomb
    assert token == inner.version  # ... on the planted bytes' token: torch's next write replaces them
    assert mine.refusals.count == 1 and "not signed with this job's key" in notes[0]
    state, _, written = mine.set_state(pickle.dumps({"mine": 2}), token)
    assert written and pickle.loads(mine.get_state()[0]) == {"mine": 2}


def test_a_state_replayed_during_the_wait_is_refused():
    inner, rival, _ = _pair([])
    rival.set_state(pickle.dumps({"n": 1}), None)
    old = inner.value
    rival.set_state(pickle.dumps({"n": 2}), inner.version)

    def replay(seconds: float) -> None:
        inner.value, inner.version = old, inner.version + 1  # an earlier signed state written back

    mine = SealedBackend(inner, KEY.signer("job"), Refusals(), sleep=replay, draw=lambda: 1.0)
    state, _, written = mine.set_state(pickle.dumps({"mine": 1}), None)
    assert not written and pickle.loads(state) == {"n": 2} and mine.refusals.count == 1


def test_agents_that_all_write_at_once_each_land_their_change(monkeypatch):
    """torch's loop, reduced: read, add yourself, compare-and-set until it holds (each a thread)."""
    monkeypatch.setattr(sealed_mod, "BACKOFF_S", 0.0005)
    monkeypatch.setattr(sealed_mod, "BACKOFF_CAP_S", 0.01)
    inner = MemoryBackend()
    signer = KEY.signer("job")
    go = threading.Barrier(16)

    def agent(name: str) -> None:
        backend = SealedBackend(inner, signer, Refusals())
        got = backend.get_state()
        state, token = (pickle.loads(got[0]), got[1]) if got else (set(), None)
        go.wait()
        while True:
            answer = backend.set_state(pickle.dumps(state | {name}), token)
            assert answer is not None
            if answer[2]:
                return
            state, token = pickle.loads(answer[0]), answer[1]

    threads = [threading.Thread(target=agent, args=(f"n{i}",)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    reader = SealedBackend(inner, signer, Refusals())
    assert pickle.loads(reader.get_state()[0]) == {f"n{i}" for i in range(16)}
