"""The rendezvous store, read off the supervisor's tick: every network call with a deadline.

A store call on a connection to a host that vanished without a reset waits until the kernel gives the
connection up (``tcp_retries2``, about 15 minutes); torch's rendezvous handler makes such calls under
a lock its keep-alive thread also takes. So no store call runs on the agent's own thread:

- :class:`StoreWatch` keeps two daemon threads per rendezvous. The *prober* makes a fresh round trip
  to the store every interval, each on a short-lived thread of its own that it waits on for at most
  the probe deadline (a new connection each time, and a probe stuck in the kernel's retries is left
  behind, so neither hides a store that is back); the *asker* reads the round's membership (nodes waiting
  to join, whether the job is done) between rounds. The tick reads their latest answers and how long
  the store has been silent (:meth:`StoreWatch.view`), and never waits on either thread.
- :func:`within` runs a blocking call (forming a round, closing the rendezvous) on a daemon thread
  and gives up, with :class:`StoreUnreachable`, once the store has been silent longer than the store
  timeout (``--rdzv-conf read_timeout``, part of the hierarchy in policy/timeouts.py). A thread left
  stuck on a dead connection is a daemon: it goes with the agent, which ends the job on that error.

Time comes from the injected clock; the threads only ever call the store and the clock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ..clock import Clock

T = TypeVar("T")

MAX_STUCK_PROBES = 8  # probes left waiting on dead connections before the prober waits for one


class StoreUnreachable(RuntimeError):
    """The rendezvous store stayed silent longer than the store timeout."""


@dataclass(frozen=True)
class StoreView:
    """What the threads last learned, read without waiting."""

    waiting: int  # nodes waiting to join (the asker's latest answer; 0 before the first)
    done: bool  # the active nodes announced the job's end
    silent_s: float  # since the store last answered (the prober's or the asker's round trip)
    error: str  # the last failure of a call, "" when none


class StoreWatch:
    """Daemon threads that read the rendezvous store with the tick never waiting on them.

    ``probe()`` is one round trip to the store on a fresh connection (raises or blocks when the store
    is gone); ``ask()`` returns (nodes waiting, job done) for the current round. The asker runs only
    while :meth:`asking` is on (between rounds), under :attr:`lock`, which forming a round also takes,
    so torch's handler is never used from two threads at once."""

    def __init__(
        self,
        probe: Callable[[], None],
        clock: Clock,
        *,
        every_s: float = 1.0,
        probe_deadline_s: float = 5.0,
        name: str = "store",
    ) -> None:
        self.probe, self.clock, self.every_s, self.name = probe, clock, every_s, name
        self.probe_deadline_s = probe_deadline_s
        self._stuck = 0  # probes still running past their deadline (left behind)
        self.lock = threading.Lock()  # the handler's: the asker and the round's formation take it
        self._state = threading.Lock()  # guards the answers below; held only to copy them
        self._stop = threading.Event()
        self._ask: Callable[[], tuple[int, bool]] | None = None
        self._waiting, self._done, self._error = 0, False, ""
        self._answered = clock.monotonic()  # silence counts from the watch's start
        self._threads: list[threading.Thread] = []

    # --- the threads ---------------------------------------------------------------------------------

    def start(self) -> StoreWatch:
        for target, what in ((self._probe_loop, "probe"), (self._ask_loop, "ask")):
            t = threading.Thread(target=target, name=f"stalwart-{self.name}-{what}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        """Stop asking; a thread stuck in a call is left to the process's end (it is a daemon)."""
        self._stop.set()

    def _probe_loop(self) -> None:
        while not self._stop.is_set():
            if self._stuck < MAX_STUCK_PROBES:  # else the store stays silent until one returns
                self._probe_once()
            self._stop.wait(self.every_s)

    def _probe_once(self) -> None:
        finished = threading.Event()

        def run() -> None:
            try:
                self.probe()
            except Exception as exc:  # noqa: BLE001 - any failure is the store's silence
                self._failed(exc)
            else:
                self._heard()
            finally:
                finished.set()
                with self._state:
                    self._stuck -= late[0]

        late = [0]
        threading.Thread(target=run, name=f"stalwart-{self.name}-probe-call", daemon=True).start()
        if not finished.wait(self.probe_deadline_s):
            with self._state:
                if not finished.is_set():
                    late[0] = 1
                    self._stuck += 1
                    self._error = f"no answer within {self.probe_deadline_s:g}s"

    def _ask_loop(self) -> None:
        while not self._stop.is_set():
            ask = self._ask
            if ask is not None:
                with self.lock:
                    if self._ask is ask:  # a round may have started while this thread waited
                        self._call_ask(ask)
            self._stop.wait(self.every_s)

    def _call_ask(self, ask: Callable[[], tuple[int, bool]]) -> None:
        try:
            waiting, done = ask()
        except Exception as exc:  # noqa: BLE001
            self._failed(exc)
            return
        with self._state:
            self._waiting, self._done = waiting, done
        self._heard()

    def _heard(self) -> None:
        with self._state:
            self._answered, self._error = self.clock.monotonic(), ""

    def _failed(self, exc: BaseException) -> None:
        text = str(exc).splitlines()[0] if str(exc) else ""
        with self._state:
            self._error = f"{type(exc).__name__}: {text}" if text else type(exc).__name__

    # --- the tick's side -----------------------------------------------------------------------------

    def asking(self, ask: Callable[[], tuple[int, bool]] | None) -> None:
        """Read the membership with ``ask`` from now on (None: stop, a round is forming)."""
        with self._state:
            self._ask = ask
            self._waiting, self._done = 0, False

    def view(self) -> StoreView:
        with self._state:
            silent = max(0.0, self.clock.monotonic() - self._answered)
            return StoreView(self._waiting, self._done, silent, self._error)

    def check(self, timeout_s: float, what: str) -> StoreView:
        """The view, or :class:`StoreUnreachable` when the store has been silent over ``timeout_s``."""
        v = self.view()
        if v.silent_s > timeout_s:
            last = f"; last error: {v.error}" if v.error else ""
            raise StoreUnreachable(
                f"{what} has not answered for {v.silent_s:.0f}s "
                f"(store timeout {timeout_s:g}s, --rdzv-conf read_timeout){last}"
            )
        return v


def within(
    call: Callable[[], T],
    watch: StoreWatch,
    timeout_s: float,
    what: str,
    *,
    poll_s: float = 0.2,
    wait: Callable[[threading.Event, float], bool] | None = None,
) -> T:
    """``call()`` on a daemon thread: its result, its exception, or :class:`StoreUnreachable` once the
    store has been silent over ``timeout_s`` while the call ran (checked every ``poll_s``)."""
    done = threading.Event()
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name=f"stalwart-{watch.name}-call", daemon=True).start()
    wait = wait or (lambda ev, s: ev.wait(s))
    while not wait(done, poll_s):
        watch.check(timeout_s, what)
    if "error" in box:
        raise box["error"]  # type: ignore[misc]  # a BaseException, checked above
    return box["value"]  # type: ignore[return-value]  # call()'s result
