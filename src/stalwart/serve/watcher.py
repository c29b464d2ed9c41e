"""A background thread that follows one run's ledgers and keeps its latest snapshot.

Readers (a Prometheus scrape, a dashboard request) only take the latest snapshot: they never read a
ledger or compute anything, so a scrape costs the same however large the run is and never waits on
the agent. The thread's own work per cycle is bounded: at most ``max_rows`` new rows per poll, and
the accounting is recomputed at most once per ``interval_s`` (and never more often than twice the
time the last computation took, so a huge ledger cannot keep a core busy).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from .snapshot import ModelSpec, RunSnapshot, goodput_series, take
from .tail import LedgerTail

SERIES_MAX = 240  # goodput points kept for the live chart
BACKFILL_POINTS = 30  # a run opened after it started: its past, recomputed at this many instants
BACKFILL_MAX_EVENTS = 50_000  # ... only when that is cheap (each point is one goodput computation)


class RunWatcher:
    def __init__(
        self,
        run_dir: str | Path,
        *,
        interval_s: float = 1.0,
        max_rows: int = 50_000,
        model: ModelSpec | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.tail = LedgerTail(run_dir, max_rows=max_rows)
        self.interval_s = interval_s
        self.model = model
        self._clock = clock
        self._snap = RunSnapshot(run_id="", now=clock(), events=0, started=False, finished=False)
        self._series: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cost_s = 0.0
        self.cycles = 0
        self.loading = True
        self.on_refresh: list[Callable[[RunSnapshot], object]] = []  # called in the watcher thread

    # --- reading (any thread) ----------------------------------------------------------------

    def snapshot(self) -> RunSnapshot:
        with self._lock:
            return self._snap

    def series(self) -> list[tuple[float, float]]:
        with self._lock:
            return list(self._series)

    @property
    def errors(self) -> tuple[str, ...]:
        return self.tail.errors

    # --- the work of one cycle ---------------------------------------------------------------

    def refresh(self) -> RunSnapshot:
        """Read what is new (bounded) and recompute the snapshot; called by the thread, or by tests.

        Serialised: a snapshot computed from an older read never replaces a newer one.
        """
        with self._refresh_lock:
            return self._refresh()

    def _refresh(self) -> RunSnapshot:
        t0 = time.perf_counter()
        result = self.tail.poll()
        snap = self.snapshot()
        if not result.caught_up and snap.started:
            self.loading = True
            return snap  # catch up first (bounded reads); the accounting is recomputed once caught up
        if result.new_events or not snap.started or not snap.finished:
            snap = take(self.tail.events(), self._clock(), model=self.model)
            if result.errors and not snap.error:
                snap = _with_error(snap, "; ".join(result.errors))
        with self._lock:
            self._snap = snap
            at = snap.job_start + snap.wall_s
            if snap.started and snap.wall_s > 0 and not snap.error and result.caught_up:
                if not self._series and snap.events <= BACKFILL_MAX_EVENTS:
                    self._series = list(
                        goodput_series(self.tail.events(), snap.job_start, at, BACKFILL_POINTS)
                    )
                if not self._series or self._series[-1][0] < at:
                    self._series.append((at, snap.goodput))
                del self._series[:-SERIES_MAX]
        self.loading = not result.caught_up  # only now: the snapshot covers what was read
        for hook in self.on_refresh:
            hook(snap)
        self._cost_s = time.perf_counter() - t0
        self.cycles += 1
        return snap

    # --- thread ------------------------------------------------------------------------------

    def start(self) -> RunWatcher:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="stalwart-watcher", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception as exc:  # noqa: BLE001 - the watcher must outlive any one bad cycle
                with self._lock:
                    self._snap = _with_error(self._snap, f"cannot read the run: {exc}")
            self._stop.wait(0.0 if self.loading else max(self.interval_s, 2 * self._cost_s))

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None


def _with_error(snap: RunSnapshot, error: str) -> RunSnapshot:

    return replace(snap, error=error)
