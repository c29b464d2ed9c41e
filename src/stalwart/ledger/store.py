"""Append-only event store on SQLite (WAL).

One writer per file, enforced with an exclusive ``flock`` on a sidecar lock file; any number of
readers, which can merge several files (one per agent or rank). Every append is its own committed
transaction, so a writer that crashes (even SIGKILL) loses nothing it had appended.

A new ledger is built complete (schema and ``meta``) in a hidden temporary file and renamed into
place, so a reader never sees a ledger without its tables. A full disk raises
:class:`~stalwart.errors.LedgerFullError`. Files are created private (0600).
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import math
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import LedgerError, LedgerFullError, LedgerNotReadyError
from ..events import Event, decode, encode

FORMAT = "stalwart-ledger"
SCHEMA_VERSION = 1
SUFFIX = ".ledger"
FILE_MODE = 0o600
# a ledger with an empty meta table younger than this may be a ledger its (pre-atomic) writer is still creating
NOT_READY_AGE_S = 10.0

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
_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}


def _is_full(exc: BaseException) -> bool:
    if isinstance(exc, OSError):
        return exc.errno in _FULL_ERRNOS
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and code & 0xFF == sqlite3.SQLITE_FULL:
        return True
    return "disk is full" in str(exc)


def _write_error(path: Path, exc: BaseException, doing: str) -> LedgerError:
    if _is_full(exc):
        return LedgerFullError(
            f"cannot {doing} ledger {path}: the disk is full",
            "free space (or raise the quota) under the run directory; events appended before are kept",
        )
    detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return LedgerError(f"cannot {doing} ledger {path}: {detail}", "choose a writable --run-dir")


def _remove_quietly(*paths: Path) -> None:
    for p in paths:
        try:
            p.unlink()
        except OSError:
            pass


def _sidecars(path: Path) -> tuple[Path, Path]:
    return Path(f"{path}-wal"), Path(f"{path}-shm")


def _create(path: Path, writer: str, fsync: bool) -> None:
    """Build a complete ledger in a hidden file next to ``path`` and rename it into place."""
    for stale in path.parent.glob(f".{path.name}.creating-*"):  # left by a writer that died here
        _remove_quietly(stale, *_sidecars(stale))
    tmp = path.with_name(f".{path.name}.creating-{os.getpid()}")
    try:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE))
        conn = sqlite3.connect(str(tmp), isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("BEGIN")
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    conn.execute(stmt)
            conn.executemany(
                "INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
                [
                    ("format", FORMAT),
                    ("version", str(SCHEMA_VERSION)),
                    ("writer", writer),
                    ("created", repr(time.time())),
                ],
            )
            conn.execute("COMMIT")
        finally:
            conn.close()  # checkpoints the WAL into the file
        if fsync:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, path)
    except (OSError, sqlite3.Error) as exc:
        _remove_quietly(tmp, *_sidecars(tmp))
        raise _write_error(path, exc, "create") from exc


def _private_dirs(path: Path) -> None:
    """``path`` and its missing parents, each created 0700 (a node's state directory, a simulated
    run's): ledgers hold stacks, command lines and host names. An existing one keeps its mode."""
    missing = []
    while not path.is_dir():
        missing.append(path)
        if path.parent == path:
            break
        path = path.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=0o700)
        except FileExistsError:
            pass  # made meanwhile by another writer: it keeps its own mode


class LedgerWriter:
    """The single writer of one ledger file. Thread-safe; appends are durable on return."""

    def __init__(self, path: str | os.PathLike[str], *, writer: str = "", fsync: bool = False) -> None:
        self.path = Path(path)
        try:
            _private_dirs(self.path.parent)
            self._lock_fd = os.open(str(self.path) + ".lock", os.O_RDWR | os.O_CREAT, FILE_MODE)
        except OSError as exc:
            raise _write_error(self.path, exc, "create") from exc
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(self._lock_fd)
            raise LedgerError(
                f"ledger {self.path} already has a writer", "each process must write its own ledger file"
            ) from exc
        try:
            self._conn = self._open(writer, fsync)
        except BaseException:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            raise
        self._mutex = threading.Lock()
        self._closed = False

    def _open(self, writer: str, fsync: bool) -> sqlite3.Connection:
        try:
            check_format(self.path)
        except LedgerNotReadyError:
            # missing, empty, or left table-less by a writer that died mid-creation (we hold the lock)
            _create(self.path, writer, fsync)
        try:
            conn = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode survives a crash of this process; FULL also survives power loss.
            conn.execute(f"PRAGMA synchronous={'FULL' if fsync else 'NORMAL'}")
            conn.execute("PRAGMA busy_timeout=5000")
        except sqlite3.Error as exc:
            raise _write_error(self.path, exc, "open") from exc
        return conn

    def append(self, ev: Event) -> None:
        self.extend((ev,))

    def extend(self, evs: Iterable[Event]) -> None:
        rows = [(ev.ts, *encode(ev)) for ev in evs]
        if not rows:
            return
        with self._mutex:
            if self._closed:
                raise LedgerError(f"ledger {self.path} is closed")
            try:
                self._conn.execute("BEGIN")
                self._conn.executemany("INSERT INTO events(ts, kind, payload) VALUES (?, ?, ?)", rows)
                self._conn.execute("COMMIT")
            except sqlite3.Error as exc:
                try:
                    if self._conn.in_transaction:
                        self._conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
                raise _write_error(self.path, exc, "append to") from exc

    def close(self) -> None:
        with self._mutex:
            if self._closed:
                return
            self._closed = True
            try:
                self._conn.close()
            except sqlite3.Error:
                pass  # a full disk can fail the closing checkpoint; committed rows are in the WAL
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)

    def __enter__(self) -> LedgerWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _connect_read(path: Path) -> sqlite3.Connection:
    if not path.exists():
        raise LedgerError(f"ledger file {path} does not exist", "check the --run-dir or path")
    if not path.is_file():
        raise LedgerError(f"{path} is not a regular file, so not a ledger", "point at a .ledger file")
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        conn.execute("PRAGMA busy_timeout=5000")
        return conn
    except sqlite3.Error as exc:
        raise LedgerError(f"cannot open ledger {path}: {exc}") from exc


def _young(path: Path, now: float) -> bool:
    try:
        return now - path.stat().st_mtime < NOT_READY_AGE_S
    except OSError:
        return True


def check_format(path: Path, now: float | None = None) -> None:
    """Raise LedgerError unless ``path`` is a readable Stalwart ledger of a known version.

    :class:`LedgerNotReadyError` for a file that does not exist, is empty, has no tables, or has an
    empty ``meta`` and is younger than :data:`NOT_READY_AGE_S` (a writer may still be creating it).
    """
    if not path.exists():
        raise LedgerNotReadyError(f"ledger file {path} does not exist", "check the --run-dir or path")
    if path.is_file() and path.stat().st_size == 0:
        raise LedgerNotReadyError(f"ledger {path} is empty (its writer has not created it yet)")
    conn = _connect_read(path)
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not tables:  # an empty database: nothing in it to lose or to read
            raise LedgerNotReadyError(f"ledger {path} has no tables yet (its writer is creating it)")
        if "meta" not in tables:
            raise LedgerError(
                f"{path} is an SQLite file without a ledger's tables, so not a Stalwart ledger",
                "point at a .ledger file written by stalwart, or remove the stray file",
            )
        rows = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.DatabaseError as exc:
        raise LedgerError(
            f"{path} is not a Stalwart ledger ({exc})",
            "point at a .ledger file written by stalwart, or remove the stray file",
        ) from exc
    finally:
        conn.close()
    if not rows and _young(path, time.time() if now is None else now):
        # a writer older than the atomic creation commits the tables before the meta rows
        raise LedgerNotReadyError(f"ledger {path} has no meta rows yet (its writer is creating it)")
    if rows.get("format") != FORMAT:
        raise LedgerError(
            f"{path} is an SQLite file but not a Stalwart ledger",
            "point at a .ledger file written by stalwart",
        )
    version = str(rows.get("version", "0"))
    if not version.isdigit() or int(version) > SCHEMA_VERSION:
        raise LedgerError(
            f"{path} has ledger schema v{version[:20]}; this stalwart reads up to v{SCHEMA_VERSION}",
            "upgrade stalwart",
        )


def _well_typed(ev: Event) -> str:
    """'' when the event's plain fields hold values of their declared types, else why not."""
    if isinstance(ev.ts, bool) or not isinstance(ev.ts, (int, float)) or not math.isfinite(ev.ts):
        return "its timestamp is not a finite number"
    for f in dataclasses.fields(ev):
        want = str(f.type).split("#")[0].strip()
        value = getattr(ev, f.name)
        ok = {
            "str": lambda v: isinstance(v, str),
            "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
            "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
            "bool": lambda v: isinstance(v, bool),
            "int | None": lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)),
        }.get(want)
        if ok is not None and not ok(value):
            return f"field {f.name!r} should be {want}, got {type(value).__name__}"
    return ""


def _decode_row(kind: object, payload: object) -> Event | str:
    """The event of one row, or the reason it cannot be read."""
    if not isinstance(kind, str) or not isinstance(payload, str):
        return "kind or payload is not text"
    try:
        data = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        return f"payload is not JSON ({type(exc).__name__})"
    if not isinstance(data, dict):
        return f"payload is JSON {type(data).__name__}, not an object"
    try:
        ev = decode(kind, data)
    except (ValueError, TypeError) as exc:
        return f"payload does not make a {kind[:40]} event ({type(exc).__name__})"
    why = _well_typed(ev)
    return why or ev


def _read_rows(path: Path) -> tuple[list[Event], list[str]]:
    check_format(path)
    conn = _connect_read(path)
    try:
        rows = conn.execute("SELECT seq, kind, payload FROM events ORDER BY seq").fetchall()
    except sqlite3.DatabaseError as exc:
        raise LedgerError(
            f"ledger {path} is corrupt: {exc}",
            "restore it from a copy; other ledger files of the run are still readable",
        ) from exc
    finally:
        conn.close()
    events: list[Event] = []
    bad: list[str] = []
    for seq, kind, payload in rows:
        got = _decode_row(kind, payload)
        if isinstance(got, str):
            bad.append(f"row {seq}: {got}")
        else:
            events.append(got)
    return events, bad


def read_file(path: str | os.PathLike[str]) -> list[Event]:
    """All events of one ledger file, in append order. A row that cannot be decoded is an error."""
    path = Path(path)
    events, bad = _read_rows(path)
    if bad:
        raise LedgerError(
            f"ledger {path} has {len(bad)} unreadable row(s) ({bad[0]})",
            "'stalwart report' reads the rest and lists what it skipped",
        )
    return events


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


@dataclass(frozen=True)
class Skipped:
    """A ledger file (``rows == 0``) or some rows of one that a tolerant read left out, and why."""

    path: Path
    reason: str
    rows: int = 0
    not_ready: bool = False  # the file is being created: neither foreign nor corrupt


@dataclass(frozen=True)
class LedgerRead:
    events: list[Event]
    skipped: tuple[Skipped, ...] = ()


def _files_of(location: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[Path]:
    if isinstance(location, (str, os.PathLike)):
        return ledger_files(location)
    return [Path(f) for f in location]


def _merge(per_file: list[list[Event]]) -> list[Event]:
    keyed: list[tuple[float, int, int, Event]] = []
    for fi, evs in enumerate(per_file):
        for seq, ev in enumerate(evs):
            keyed.append((ev.ts, fi, seq, ev))
    keyed.sort(key=lambda t: t[:3])
    return [t[3] for t in keyed]


def read_merged(location: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[Event]:
    """Events of several files merged into one timeline, ordered by timestamp (stable per file).

    Strict: any unreadable file or row raises :class:`LedgerError`. See :func:`read_available`.
    """
    return _merge([read_file(f) for f in _files_of(location)])


def read_available(
    location: str | os.PathLike[str] | Iterable[str | os.PathLike[str]], *, require_some: bool = True
) -> LedgerRead:
    """Like :func:`read_merged`, but reads what it can and says what it left out.

    A foreign, corrupt or not-yet-created file is skipped whole; undecodable rows are skipped one by
    one. With ``require_some``, raises when files were given but none of them could be read.
    """
    files = _files_of(location)
    per_file: list[list[Event]] = []
    skipped: list[Skipped] = []
    for f in files:
        try:
            events, bad = _read_rows(f)
        except LedgerError as exc:
            skipped.append(Skipped(f, str(exc), not_ready=isinstance(exc, LedgerNotReadyError)))
            continue
        per_file.append(events)
        if bad:
            skipped.append(Skipped(f, "; ".join(bad[:3]) + (" ..." if len(bad) > 3 else ""), rows=len(bad)))
    if require_some and files and not per_file:
        raise LedgerError(
            f"none of the {len(files)} ledger file(s) could be read; first: {skipped[0].reason}",
            "point at the run directory of 'stalwart run'",
        )
    return LedgerRead(_merge(per_file), tuple(skipped))


def set_aside(path: Path, now: float | None = None) -> Path:
    """Rename an unreadable ledger (and its WAL files) out of the way as ``<name>.corrupt-<ts>``."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(time.time() if now is None else now))
    target = path.with_name(f"{path.name}.corrupt-{stamp}-{os.getpid()}")
    os.replace(path, target)
    for side, suffix in zip(_sidecars(path), ("-wal", "-shm"), strict=True):
        if side.exists():
            os.replace(side, Path(f"{target}{suffix}"))
    return target


def iter_kind(events: Iterable[Event], *kinds: type[Event]) -> Iterator[Event]:
    return (ev for ev in events if isinstance(ev, kinds))
