"""What paces a board's polls (launch/inplace/board.py): a daemon thread that polls every
:data:`POLL_S` and sooner when pushed, or a manual ticker for tests.

Between two polls the thread waits in the board's ``idle`` (:class:`Waker`): on the
board's own wake pipe (the supervisor handed over a change: write it now, not at the next poll) and
on its liveness sockets (another agent's board wrote the document and nudged: read it now). A poll
is thus pushed rather than waited for; the interval still bounds it when no nudge comes (a nudge is
an optimization, never the only way news arrives: the store's version read decides)."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from ..clock import ManualClock

POLL_S = 0.1
PUSH_GAP_S = 0.01  # pushed polls and wakes at most this often: a nudge is unsigned and anyone can
# connect to a liveness line, so a flood of bytes makes a board read the store at most 100 times a second

# wait up to the seconds given for a push; True: poll now (a change handed over, a nudge read)
Idle = Callable[[float], bool]


class Ticker(Protocol):
    """What paces a board's polls: ``poll`` is called until ``stopped`` is set; between polls the
    ticker may wait in ``idle``."""

    def start(self, poll: Callable[[], None], stopped: threading.Event, idle: Idle) -> None: ...


class ThreadTicker:
    """Polls on a daemon thread at least every :data:`POLL_S` of real time, and at once when ``idle``
    says so, but never twice within :data:`PUSH_GAP_S`, and it wakes at most once per gap for bytes
    that ask for no poll (a call stuck on a dead host holds only that thread)."""

    def start(self, poll: Callable[[], None], stopped: threading.Event, idle: Idle) -> None:
        def loop() -> None:
            while not stopped.is_set():
                polled = time.monotonic()
                poll()
                deadline = polled + POLL_S
                while not stopped.is_set():
                    woke = time.monotonic()
                    if deadline - woke <= 0:
                        break
                    if idle(deadline - woke):
                        stopped.wait(max(0.0, polled + PUSH_GAP_S - time.monotonic()))
                        break
                    # woken by bytes that asked for no poll (beats): at most once per gap, so a
                    # connection that floods a line costs this thread no more than that
                    stopped.wait(max(0.0, woke + PUSH_GAP_S - time.monotonic()))

        threading.Thread(target=loop, name="stalwart-inplace-board", daemon=True).start()


class ManualTicker:
    """Polls only when told to: each :meth:`tick` moves ``clock`` on by :data:`POLL_S` and polls every
    open board once, on the caller's thread, in the order the boards were made (pushes are ignored:
    the tests decide when each board polls)."""

    def __init__(self, clock: ManualClock | None = None) -> None:
        self.clock = clock
        self._boards: list[tuple[Callable[[], None], threading.Event]] = []

    def start(self, poll: Callable[[], None], stopped: threading.Event, idle: Idle) -> None:
        self._boards.append((poll, stopped))

    def tick(self, n: int = 1) -> None:
        for _ in range(n):
            if self.clock is not None:
                self.clock.advance(POLL_S)
            for poll, stopped in list(self._boards):
                if not stopped.is_set():
                    poll()


class Waker:
    """A board's wake pipe: the owner's thread wakes the poll thread (never waits), and the poll thread
    waits on the pipe and other descriptors at once."""

    def __init__(self) -> None:
        self._r, self._w = socket.socketpair()
        self._r.setblocking(False)
        self._w.setblocking(False)

    def wake(self) -> None:
        try:
            self._w.send(b"w")
        except OSError:  # full (a wake is pending already) or closed (the board is closing)
            pass

    def wait(self, timeout_s: float, fds: Iterable[int]) -> tuple[bool, set[int]]:
        """Wait up to ``timeout_s`` for the pipe or any of ``fds`` to be readable (or to end): whether
        the pipe was woken (drained), and which of ``fds`` are ready. poll(2), not select(2): a first
        node of a large job holds more than 1,024 descriptors."""
        mine = self._r.fileno()
        if mine < 0:  # closed: the board is closing
            return True, set()
        waiting = select.poll()
        waiting.register(mine, select.POLLIN)
        for fd in fds:
            waiting.register(fd, select.POLLIN)
        try:
            ready = waiting.poll(max(0, int(timeout_s * 1000)))
        except (OSError, ValueError):  # a descriptor closed under the wait: poll again
            return True, set()
        woken = False
        others = set()
        for fd, ev in ready:
            if fd == mine:
                woken = self._drain()
            elif ev & select.POLLNVAL:
                woken = True  # closed by the owner's thread: the next poll reads the lines afresh
            else:
                others.add(fd)
        return woken, others

    def _drain(self) -> bool:
        try:
            while self._r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        return True

    def close(self) -> None:
        for sock in (self._r, self._w):
            try:
                sock.close()
            except OSError:
                pass


__all__ = ["POLL_S", "PUSH_GAP_S", "Idle", "ManualTicker", "ThreadTicker", "Ticker", "Waker"]
