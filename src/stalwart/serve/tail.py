"""Incremental reading of a run's ledgers: each poll reads only rows appended since the last one.

The exporter and the dashboard poll in a background thread; a poll reads at most ``max_rows`` new
rows in total, so one poll's work is bounded however large the ledgers grow. A file that cannot be
read (corrupt, foreign) is reported in :attr:`LedgerTail.errors` and skipped; the other files of the
run stay readable, and nothing is ever written to a ledger.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import LedgerError
from ..events import Event, decode
from ..ledger import SUFFIX, check_format


@dataclass(frozen=True)
class PollResult:
    new_events: int
    files: int
    errors: tuple[str, ...]
    caught_up: bool  # False when the row budget ran out before every file was read to its end


SETTLE_S = 5.0  # a ledger file younger than this that cannot be read yet is still being created


def _settling(path: Path) -> bool:
    try:
        st = path.stat()
    except OSError:
        return True
    return st.st_size == 0 or time.time() - st.st_mtime < SETTLE_S


def _ledger_dir(root: Path) -> Path:
    return root / "ledger" if (root / "ledger").is_dir() else root


class LedgerTail:
    """Follow every ``*.ledger`` file of one run directory (new files are picked up as they appear)."""

    def __init__(self, run_dir: str | Path, *, max_rows: int = 50_000) -> None:
        self.root = Path(run_dir)
        self.max_rows = max_rows
        self._seq: dict[Path, int] = {}
        self._bad: dict[Path, str] = {}
        self._events: list[Event] = []
        self._unsorted = False
        self._lock = threading.Lock()
        self._poll_lock = threading.Lock()

    @property
    def errors(self) -> tuple[str, ...]:
        return tuple(self._bad.values())

    def files(self) -> list[Path]:
        d = _ledger_dir(self.root)
        if self.root.is_file():
            return [self.root]
        return sorted(d.glob(f"*{SUFFIX}")) if d.is_dir() else []

    def poll(self) -> PollResult:
        """Read up to ``max_rows`` new rows across the files; returns what was done.

        Polls are serialised (a second caller waits for the first), so no row is read twice.
        """
        with self._poll_lock:
            return self._poll()

    def _poll(self) -> PollResult:
        budget = self.max_rows
        fresh: list[Event] = []
        files = self.files()
        caught_up = True
        for path in files:
            if budget <= 0:
                caught_up = False
                break
            try:
                rows = self._read_since(path, budget)
            except LedgerError as exc:
                # a file being created has no schema yet: not an error until it stays that way
                if not _settling(path):
                    self._bad[path] = str(exc)
                continue
            self._bad.pop(path, None)
            if len(rows) >= budget:
                caught_up = False
            budget -= len(rows)
            for seq, kind, payload in rows:
                fresh.append(decode(kind, payload))
                self._seq[path] = seq
        if fresh:
            with self._lock:
                self._events.extend(fresh)
                self._unsorted = True
        return PollResult(len(fresh), len(files), self.errors, caught_up)

    def _read_since(self, path: Path, limit: int) -> list[tuple[int, str, str]]:
        if path not in self._seq:
            check_format(path)  # retried on every poll until it passes (files appear before their schema)
            self._seq[path] = 0
        try:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot open ledger {path}: {exc}") from exc
        try:
            return conn.execute(
                "SELECT seq, kind, payload FROM events WHERE seq > ? ORDER BY seq LIMIT ?",
                (self._seq[path], limit),
            ).fetchall()
        except sqlite3.DatabaseError as exc:
            raise LedgerError(
                f"ledger {path.name} is corrupt: {exc}",
                "restore it from a copy; the other ledger files of the run are still shown",
            ) from exc
        finally:
            conn.close()

    def events(self) -> list[Event]:
        """All events read so far, merged into one timeline by timestamp (a copy)."""
        with self._lock:
            if self._unsorted:
                self._events.sort(key=lambda e: e.ts)  # stable: append order kept for equal stamps
                self._unsorted = False
            return list(self._events)

    def count(self) -> int:
        return len(self._events)
