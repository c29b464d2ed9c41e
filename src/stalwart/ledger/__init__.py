"""Append-only event ledger (SQLite WAL, one writer per file, readers merge files)."""

from .store import (
    SUFFIX,
    LedgerRead,
    LedgerWriter,
    Skipped,
    check_format,
    iter_kind,
    ledger_files,
    read_available,
    read_file,
    read_merged,
    set_aside,
)

__all__ = [
    "SUFFIX",
    "LedgerRead",
    "LedgerWriter",
    "Skipped",
    "check_format",
    "iter_kind",
    "ledger_files",
    "read_available",
    "read_file",
    "read_merged",
    "set_aside",
]
