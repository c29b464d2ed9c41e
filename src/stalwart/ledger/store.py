"""Append-only event store on SQLite (WAL).

One writer per file, enforced with an exclusive ``flock`` on a sidecar lock file; any number of
readers, which can merge several files (one per agent or rank). Every append is its own committed
transaction, so a writer that crashes (even SIGKILL) loses nothing it had appended.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from ..errors import LedgerError
from ..events import Event, decode, encode

FORMAT = "stalwart-ledger"
SCHEMA_VERSION = 1
SUFFIX = ".ledger"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    ts REAL NOT NULL,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_kind ON events(kind);
"""


class LedgerWriter:
    """The single writer of one ledger file. Thread-safe; appends are durable on return."""

    def __init__(self, path: str | os.PathLike[str], *, writer: str = "", fsync: bool = False) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LedgerError(
                f"cannot create ledger directory {self.path.parent}: {exc.strerror}",
                "choose a writable --run-dir",
            ) from exc
        self._lock_fd = os.open(str(self.path) + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(self._lock_fd)
            raise LedgerError(
                f"ledger {self.path} already has a writer", "each process must write its own ledger file"
            ) from exc
        existed = self.path.exists() and self.path.stat().st_size > 0
        if existed:
            check_format(self.path)
        self._conn = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode survives a crash of this process; FULL also survives power loss.
        self._conn.execute(f"PRAGMA synchronous={'FULL' if fsync else 'NORMAL'}")
        self._conn.execute("PRAGMA busy_timeout=5000")
        self._conn.executescript(_SCHEMA)
        if not existed:
            with self._conn:
                self._conn.executemany(
                    "INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
                    [
                        ("format", FORMAT),
                        ("version", str(SCHEMA_VERSION)),
                        ("writer", writer),
                        ("created", repr(time.time())),
                    ],
                )
        self._mutex = threading.Lock()
        self._closed = False

    def append(self, ev: Event) -> None:
        self.extend((ev,))

    def extend(self, evs: Iterable[Event]) -> None:
        rows = [(ev.ts, *encode(ev)) for ev in evs]
        if not rows:
            return
        with self._mutex:
            if self._closed:
                raise LedgerError(f"ledger {self.path} is closed")
            self._conn.execute("BEGIN")
            self._conn.executemany("INSERT INTO events(ts, kind, payload) VALUES (?, ?, ?)", rows)
            self._conn.execute("COMMIT")

    def close(self) -> None:
        with self._mutex:
            if self._closed:
                return
            self._closed = True
            self._conn.close()
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)

    def __enter__(self) -> LedgerWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _connect_read(path: Path) -> sqlite3.Connection:
    if not path.exists():
        raise LedgerError(f"ledger file {path} does not exist", "check the --run-dir or path")
    if path.is_dir():
        raise LedgerError(f"{path} is a directory, not a ledger file")
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        conn.execute("PRAGMA busy_timeout=5000")
        return conn
    except sqlite3.Error as exc:
        raise LedgerError(f"cannot open ledger {path}: {exc}") from exc


def check_format(path: Path) -> None:
    """Raise LedgerError unless ``path`` is a readable Stalwart ledger of a known version."""
    conn = _connect_read(path)
    try:
        rows = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.DatabaseError as exc:
        raise LedgerError(
            f"{path} is not a Stalwart ledger ({exc})",
            "point at a .ledger file written by stalwart, or remove the stray file",
        ) from exc
    finally:
        conn.close()
    if rows.get("format") != FORMAT:
        raise LedgerError(
            f"{path} is an SQLite file but not a Stalwart ledger",
            "point at a .ledger file written by stalwart",
        )
    version = int(rows.get("version", "0"))
    if version > SCHEMA_VERSION:
        raise LedgerError(
            f"{path} has ledger schema v{version}; this stalwart reads up to v{SCHEMA_VERSION}",
            "upgrade stalwart",
        )


def read_file(path: str | os.PathLike[str]) -> list[Event]:
    """All events of one ledger file, in append order."""
    path = Path(path)
    check_format(path)
    conn = _connect_read(path)
    try:
        rows = conn.execute("SELECT kind, payload FROM events ORDER BY seq").fetchall()
    except sqlite3.DatabaseError as exc:
        raise LedgerError(
            f"ledger {path} is corrupt: {exc}",
            "restore it from a copy; other ledger files of the run are still readable",
        ) from exc
    finally:
        conn.close()
    return [decode(kind, payload) for kind, payload in rows]


def ledger_files(location: str | os.PathLike[str]) -> list[Path]:
    """The ledger files of a run: ``location`` is a file, a ledger dir, or a run dir."""
    p = Path(location)
    if p.is_file():
        return [p]
    for candidate in (p / "ledger", p):
        if candidate.is_dir():
            files = sorted(candidate.glob(f"*{SUFFIX}"))
            if files:
                return files
    if not p.exists():
        raise LedgerError(f"{p} does not exist", "pass a run directory or a .ledger file")
    raise LedgerError(
        f"no ledger files (*{SUFFIX}) under {p}", "pass the run directory given to 'stalwart run'"
    )


def read_merged(location: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[Event]:
    """Events of several files merged into one timeline, ordered by timestamp (stable per file)."""
    if isinstance(location, (str, os.PathLike)):
        files = ledger_files(location)
    else:
        files = [Path(f) for f in location]
    keyed: list[tuple[float, int, int, Event]] = []
    for fi, f in enumerate(files):
        for seq, ev in enumerate(read_file(f)):
            keyed.append((ev.ts, fi, seq, ev))
    keyed.sort(key=lambda t: t[:3])
    return [t[3] for t in keyed]


def iter_kind(events: Iterable[Event], *kinds: type[Event]) -> Iterator[Event]:
    return (ev for ev in events if isinstance(ev, kinds))
