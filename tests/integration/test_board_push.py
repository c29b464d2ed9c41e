"""Board news is pushed, not polled (launch/inplace/ticker.py, liveness.py): three boards on a real
TCPStore, each on its own poll thread (the agent's ticker), the first node's watching the other two
through their liveness lines. Once they are connected the poll interval is raised to ten minutes, so
a board that learns anything within the test's bound learned it from a push:

* a change handed to a board is written at once (its wake pipe), not at its next poll;
* the board that wrote it nudges its watcher (the first node), which reads it and passes the nudge
  on to the other node it watches, which reads it too.

And the pieces alone: a nudge crosses a liveness connection both ways; the wake pipe wakes a wait."""

from __future__ import annotations

import socket
import threading
import time
from datetime import timedelta

import pytest

from stalwart.job_key import JobKey, KeySource
from stalwart.launch.inplace import ticker
from stalwart.launch.inplace.board import Announcement, StoreBoard
from stalwart.launch.inplace.liveness import Line, Watch

pytestmark = pytest.mark.integration

SIGNER = JobKey(b"p" * 32, KeySource.FILE).signer("job")
BOUND_S = 60.0  # what the test waits at most for a push (the poll would come after 600 s)


@pytest.fixture
def store():
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=10), wait_for_workers=False)


def _until(done, bound_s: float = BOUND_S) -> bool:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if done():
            return True
        time.sleep(0.01)
    return False


def test_an_announcement_reaches_every_board_by_push_when_polls_are_ten_minutes_apart(store, monkeypatch):
    def board(node: str, watch: tuple[str, ...] = ()) -> StoreBoard:
        return StoreBoard(
            "127.0.0.1", store.port, 10.0, node=node, watch=watch, signer=SIGNER, live_host="127.0.0.1"
        )

    first, n1, n2 = board("n0", ("n1", "n2")), board("n1"), board("n2")
    boards = (first, n1, n2)
    try:
        # the first node dials both lines and each line holds its connection (usual 0.1 s polls)
        assert _until(lambda: set(first._watch.hosts()) == {"n1", "n2"})
        assert _until(lambda: all(b._line is not None and b._line.fds() for b in (n1, n2)))
        monkeypatch.setattr(ticker, "POLL_S", 600.0)
        time.sleep(0.3)  # every poll thread is now in a wait that ends only after ten minutes or a push
        polls = {b: b._polls for b in boards}

        a = Announcement(2, "n1", (1,))
        n1.announce(a)
        assert _until(lambda: n1.latest() == a)  # written at once: its wake pipe
        assert _until(lambda: first.latest() == a)  # n1 nudged its watcher
        assert _until(lambda: n2.latest() == a)  # the first node passed the nudge on
        assert all(b._polls > polls[b] for b in boards)  # each learned it in a poll a push started
    finally:
        for b in boards:
            b.close()


def test_a_nudge_crosses_a_liveness_connection_both_ways():
    line, watch = Line("127.0.0.1"), Watch(time.monotonic)
    try:
        assert watch.dial("n1", line.address)
        assert _until(lambda: (watch.poll(), line.accept(), "n1" in watch.hosts())[-1])
        line.beat()
        assert _until(lambda: (watch.poll(), "n1" in watch.quiet())[-1])
        assert not watch.take_nudge()  # a beat is no nudge
        line.nudge()
        assert _until(lambda: (watch.poll(), watch.take_nudge())[-1])
        assert not watch.take_nudge()  # taken once
        watch.nudge()
        assert _until(lambda: line.drain(set(line.fds())))
        assert watch.dead() == {}
    finally:
        watch.close()
        line.close()


def test_the_wake_pipe_ends_a_wait_and_a_readable_descriptor_is_named():
    waker = ticker.Waker()
    line, watch = Line("127.0.0.1"), Watch(time.monotonic)
    try:
        threading.Timer(0.05, waker.wake).start()
        woken, ready = waker.wait(BOUND_S, [])
        assert woken and not ready
        assert watch.dial("n1", line.address)
        assert _until(lambda: (watch.poll(), line.accept(), "n1" in watch.hosts())[-1])
        line.nudge()
        woken, ready = waker.wait(BOUND_S, watch.fds())
        assert not woken and ready == set(watch.fds())
    finally:
        waker.close()
        watch.close()
        line.close()


def test_a_closed_wake_pipe_ends_the_wait_at_once_and_a_wake_after_close_is_harmless():
    waker = ticker.Waker()
    waker.close()
    waker.wake()  # the owner's thread may hand a change over while the board closes
    assert waker.wait(BOUND_S, []) == (True, set())


def test_a_flood_of_nudges_on_a_line_reads_the_store_at_most_once_per_gap(store):
    """Anyone can connect to a liveness line and send it bytes: nudges are unsigned, so they may only
    make a board read sooner, at most once per PUSH_GAP_S, never in a loop."""
    board = StoreBoard("127.0.0.1", store.port, 10.0, node="n1", signer=SIGNER, live_host="127.0.0.1")
    stop = threading.Event()
    try:
        assert _until(lambda: board._line_published)
        host, _, port = board._line.address.rpartition(":")
        flood = socket.create_connection((host, int(port)), timeout=10)

        def send() -> None:
            while not stop.is_set():
                try:
                    flood.send(b"!" * 512)
                except OSError:
                    return

        sender = threading.Thread(target=send, daemon=True)
        assert _until(lambda: bool(board._line is not None and board._line.fds()))
        t0, before = time.monotonic(), board._polls
        sender.start()
        time.sleep(1.0)
        polls, elapsed = board._polls - before, time.monotonic() - t0
        assert polls >= 1  # the board still polls (a flood does not stop it)
        assert polls <= elapsed / ticker.PUSH_GAP_S + 2, (polls, elapsed)
    finally:
        stop.set()
        board.close()
