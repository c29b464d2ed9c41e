"""Fire-once bookkeeping: a fault claims a marker file before it fires, so restarts never repeat it."""

from __future__ import annotations

import os
from pathlib import Path

from .plan import Fault


def claim(chaos_dir: Path, fault: Fault) -> bool:
    """Return True exactly once per run for a once-only fault (atomic O_EXCL create)."""
    if not fault.once:
        return True
    chaos_dir.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(chaos_dir / f"fired-{fault.marker()}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def claim_announcement(chaos_dir: Path, fault: Fault) -> bool:
    """Return True exactly once per run for any fault, once-only or not: a span fault (``slow``) is
    recorded in the ledger once, when it first takes effect, however many attempts it spans."""
    chaos_dir.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(chaos_dir / f"announced-{fault.marker()}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    os.close(fd)
    return True
