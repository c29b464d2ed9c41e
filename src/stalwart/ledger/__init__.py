"""Append-only event ledger (SQLite WAL, one writer per file, readers merge files)."""

from .store import (
    SUFFIX,
    LedgerWriter,
    check_format,
    iter_kind,
    ledger_files,
    read_file,
    read_merged,
)

__all__ = ["SUFFIX", "LedgerWriter", "check_format", "iter_kind", "ledger_files", "read_file", "read_merged"]
