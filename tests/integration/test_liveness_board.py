"""A dead agent is told by the kernel, not by a heartbeat bound (launch/inplace/liveness.py): another
node's agent runs as a real process with its board on the round's real TCPStore; the watching
board, polled by a manual ticker on a manual clock, dials its sealed liveness address, and:

* SIGKILL of that process: its connection ends without a goodbye and the watcher counts it dead;
* the agent closing its board on purpose: a goodbye, never a death;
* SIGSTOP (a host that stops answering): the connection stays open, no verdict (the heartbeat decides);
* an unsigned liveness address planted in the store is refused and never dialled."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from datetime import timedelta

import pytest

from stalwart.job_key import JobKey, KeySource
from stalwart.launch.clock import ManualClock
from stalwart.launch.inplace.board import ManualTicker, StoreBoard
from stalwart.launch.inplace.liveness import LIVE

pytestmark = pytest.mark.integration

KEY = b"k" * 32
SIGNER = JobKey(KEY, KeySource.FILE).signer("job")

AGENT = textwrap.dedent(
    """
    import sys, time
    from stalwart.job_key import JobKey, KeySource
    from stalwart.launch.inplace.board import StoreBoard
    port, mode = int(sys.argv[1]), sys.argv[2]
    board = StoreBoard("127.0.0.1", port, 10.0, node="n1", live_host="127.0.0.1",
                       signer=JobKey(b"k" * 32, KeySource.FILE).signer("job"))
    while not board._line_published:  # its own poll thread publishes the sealed address
        time.sleep(0.01)
    print("ready", flush=True)
    sys.stdin.readline()  # the test says when to go on
    if mode in ("leave", "exclude"):
        board.close(leaving=mode == "exclude")
        print("left", flush=True)
        sys.stdin.readline()
    else:
        time.sleep(3600)
    """
)


@pytest.fixture
def store():
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=10), wait_for_workers=False)


def _agent(store, mode: str) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        [sys.executable, "-c", AGENT, str(store.port), mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


def _watcher(store, clock: ManualClock, ticker: ManualTicker, notes: list[str], heard=None) -> StoreBoard:
    more = {} if heard is None else {"heard": heard}
    return StoreBoard(
        "127.0.0.1", store.port, 10.0, notes.append, node="n0", watch=("n1",), signer=SIGNER,
        ticker=ticker, clock=clock.monotonic, **more,
    )  # fmt: skip


def _tick_until(ticker: ManualTicker, done, polls: int = 200) -> bool:
    """Poll the board until ``done()`` (each poll is a real store call and a real socket read)."""
    for _ in range(polls):
        ticker.tick()
        if done():
            return True
    return False


def _published(store) -> bool:
    return store.check([LIVE + "n1"])


def _leave(p: subprocess.Popen[str]) -> None:
    """Tell the agent to close its board, and wait until it did."""
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write("go\n")
    p.stdin.flush()
    assert p.stdout.readline().strip() == "left"


def _stop(p: subprocess.Popen[str]) -> None:
    if p.poll() is None:
        p.kill()
    p.wait(timeout=30)


def _hold(watch, line, polls: int = 200) -> bool:
    """Dial ``line`` as node n1 and poll until the watch holds the connection (real sockets)."""
    assert watch.dial("n1", line.address)
    for _ in range(polls):
        watch.poll()
        line.accept()
        if "n1" in watch._held:
            return True
    return False


def test_a_killed_agent_is_dead_at_once_and_named_so(store):
    clock, notes = ManualClock(), []
    ticker = ManualTicker(clock)
    p = _agent(store, "die")
    try:
        assert _published(store)
        board = _watcher(store, clock, ticker, notes)
        assert _tick_until(ticker, lambda: board._watch.connected("n1") and "n1" in board._watch._held)
        ticker.tick(5)
        assert board.dead() == {}  # alive and quiet: no verdict
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        assert _tick_until(ticker, lambda: "n1" in board.dead(), polls=20)
        ticker.tick(3)
        assert board.dead()["n1"] == pytest.approx(0.3)  # seconds since it was seen, on the board's clock
        board.watch_more(["n1"])  # the group takes the node back: a new agent, its old verdict forgotten
        assert board.dead() == {} and not board._watch.connected("n1")
        board.close()
    finally:
        _stop(p)


@pytest.mark.parametrize("mode", ["leave", "exclude"])
def test_an_agent_that_closes_on_purpose_is_never_dead_and_one_that_leaves_the_job_is_gone_at_once(
    store, mode
):
    """Closing its board (the attempt ended) says goodbye: no verdict. Leaving a job that goes on
    without it (its node excluded itself: a straggler, silent data corruption) says so: the watcher
    counts it gone with no bound to wait out, and knows it left rather than died."""
    clock, notes = ManualClock(), []
    ticker = ManualTicker(clock)
    p = _agent(store, mode)
    try:
        board = _watcher(store, clock, ticker, notes)
        assert _tick_until(ticker, lambda: "n1" in board._watch._held)
        assert board.dead() == {} and board.left() == frozenset()
        _leave(p)
        assert _tick_until(ticker, lambda: "n1" not in board._watch._held, polls=20)
        if mode == "leave":
            assert board.dead() == {} and board.left() == frozenset()
        else:
            assert "n1" in board.dead() and board.left() == {"n1"} and p.poll() is None, "it lives: it left"
        board.close()
    finally:
        _stop(p)


def test_a_stopped_agent_keeps_its_connection_and_gets_no_verdict(store):
    clock, notes = ManualClock(), []
    ticker = ManualTicker(clock)
    p = _agent(store, "die")
    try:
        board = _watcher(store, clock, ticker, notes)
        assert _tick_until(ticker, lambda: "n1" in board._watch._held)
        os.kill(p.pid, signal.SIGSTOP)
        ticker.tick(30)
        assert board.dead() == {} and "n1" in board._watch._held
        board.close()
    finally:
        os.kill(p.pid, signal.SIGCONT)
        _stop(p)


@pytest.mark.parametrize(
    "kernel, verdict",
    [
        ("nothing since the stop", "silent"),  # a host cut off: no segment of any connection arrives
        ("a segment just now", "heard"),  # a host behind a saturated link: its traffic still arrives
        ("no reading", "none"),  # ``ss`` missing or too slow: no verdict from the line
    ],
)
def test_a_stopped_agents_quiet_outside_an_incident_counts_as_far_as_the_kernel_heard_nothing(
    store, kernel, verdict
):
    """A host that stops answering closes nothing, but its agent's beats on the line stop: the line's
    quiet grows from its last beat. With no rank waiting (no incident) that quiet alone is no verdict (a
    saturated slow link delays beats as long): the board asks when this host's kernel last took any
    segment from that host, and the silence is the shorter of the two."""
    import time

    clock, notes = ManualClock(), []
    ticker = ManualTicker(clock)
    stopped: list[float] = []
    asked: list[frozenset[str]] = []

    def heard(hosts):
        asked.append(frozenset(hosts))
        match kernel:
            case "nothing since the stop":
                return {h: clock.monotonic() - stopped[0] for h in hosts}
            case "a segment just now":
                return {h: 0.05 for h in hosts}
        return None

    p = _agent(store, "die")
    try:
        board = _watcher(store, clock, ticker, notes, heard)
        deadline = time.monotonic() + 20.0  # the agent beats every 0.5 s of real time
        while "n1" not in board._watch.quiet() and time.monotonic() < deadline:
            ticker.tick()
            time.sleep(0.05)
        assert "n1" in board._watch.quiet(), "no beat came on the line"
        os.kill(p.pid, signal.SIGSTOP)
        time.sleep(0.2)  # a beat already on its way is read by the next poll, not after the bound
        stopped.append(clock.monotonic())
        ticker.tick(30)  # 3 s on the board's clock, no beat
        assert board._watch.quiet()["n1"] >= 2.5 and board.dead() == {}
        assert asked and asked[-1] == {"127.0.0.1"}, asked  # the line's peer address, asked about
        assert len(asked) <= 30 * 0.1 / 0.25 + 1, asked  # not on every poll
        silence = board.silence()
        match verdict:
            case "silent":
                assert silence["n1"] >= 2.5, silence
            case "heard":
                assert silence["n1"] < 0.5, silence
            case _:
                assert silence == {}, silence
        board.close()
    finally:
        os.kill(p.pid, signal.SIGCONT)
        _stop(p)


def test_a_lines_quiet_counts_to_the_watchers_last_poll_not_to_now():
    """A watcher whose poll thread was not scheduled has not read the beats waiting in its socket:
    that is no silence of the watched agent's."""
    from stalwart.launch.inplace.liveness import Line, Watch

    clock = ManualClock()
    line, watch = Line("127.0.0.1"), Watch(clock.monotonic)
    try:
        assert _hold(watch, line)
        line.beat()
        for _ in range(200):
            watch.poll()
            if "n1" in watch.quiet():
                break
        assert watch.quiet() == {"n1": 0.0}
        clock.advance(10.0)  # no poll in 10 s: the quiet is still as of the last one
        assert watch.quiet() == {"n1": 0.0}
        watch.poll()  # a poll that finds nothing new: now it counts
        assert watch.quiet()["n1"] == pytest.approx(10.0)
        line.beat()
        for _ in range(200):
            watch.poll()
            if watch.quiet()["n1"] == 0.0:
                break
        assert watch.quiet()["n1"] == 0.0
    finally:
        watch.close()
        line.close()


def test_a_planted_unsigned_address_is_refused_and_never_dialled(store):
    clock, notes = ManualClock(), []
    ticker = ManualTicker(clock)
    store.set(LIVE + "n1", b"127.0.0.1:9")  # no seal: what another local user could write
    board = _watcher(store, clock, ticker, notes)
    ticker.tick(12)
    assert not board._watch.connected("n1") and board.dead() == {}
    assert any("unsigned liveness address" in n for n in notes), notes
    board.close()


def test_a_watcher_holding_more_than_1024_descriptors_still_dials():
    """A first node of a large job holds a connection per node: descriptors past select(2)'s 1,024."""
    import resource
    import socket as socketlib

    from stalwart.launch.inplace.liveness import Line, Watch

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard limit on open files is {hard}")
    resource.setrlimit(
        resource.RLIMIT_NOFILE,
        (max(soft, 1200) if hard == resource.RLIM_INFINITY else min(max(soft, 1200), hard), hard),
    )
    spare = [socketlib.socket() for _ in range(1100)]  # push the next descriptors past 1,024
    line = Line("127.0.0.1")
    clock = ManualClock()
    watch = Watch(clock.monotonic)
    try:
        assert _hold(watch, line, polls=50)
        assert watch.dead() == {}
    finally:
        watch.close()
        line.close()
        for s in spare:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_line_that_holds_no_more_says_goodbye_so_no_watcher_counts_its_agent_dead(monkeypatch):
    """Past its cap (a flood of connections) a line closes the newest with a goodbye: a real watcher
    among them is told the line is not held, never that the agent died."""
    from stalwart.launch.inplace import liveness
    from stalwart.launch.inplace.liveness import Line, Watch

    monkeypatch.setattr(liveness, "MAX_WATCHERS", 1)
    line = Line("127.0.0.1")
    clock = ManualClock()
    first, second = Watch(clock.monotonic), Watch(clock.monotonic)
    try:
        assert first.dial("n1", line.address) and second.dial("n1", line.address)
        for _ in range(50):
            line.accept()
            first.poll()
            second.poll()
            if "n1" in first._held and not second.connected("n1"):
                break
        assert "n1" in first._held  # held by the line
        assert not second.connected("n1") and second.dead() == {}  # over the cap: goodbye, no verdict
        assert first.dead() == {}
    finally:
        first.close()
        second.close()
        line.close()
