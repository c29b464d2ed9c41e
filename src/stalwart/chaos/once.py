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
        fd = os.open(chaos_dir / f"fired-{fault.marker()}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def claim_announcement(chaos_dir: Path, fault: Fault) -> bool:
    """Return True exactly once per run for any fault, once-only or not: a span fault (``slow``) is
    recorded in the ledger once, when it first takes effect, however many attempts it spans."""
    chaos_dir.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(chaos_dir / f"announced-{fault.marker()}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def mark_injected(chaos_dir: Path, what: str, pid: int | None = None) -> None:
    """Just before a fault makes this process fail: leave the plan entry under its pid, so the agent
    labels the failure as injected instead of guessing a cause (best effort: the fault fires anyway)."""
    try:
        chaos_dir.mkdir(parents=True, exist_ok=True)
        path = chaos_dir / f"injected-{os.getpid() if pid is None else pid}"
        fd = os.open(path, os.O_CREAT | os.O_TRUNC | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(what[:200])
    except OSError:
        pass


def injected_by(chaos_dir: Path, pid: int) -> str:
    """The plan entry that made process ``pid`` fail on purpose; "" when no fault of the plan did."""
    try:
        fd = os.open(chaos_dir / f"injected-{pid}", os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return ""
    with os.fdopen(fd) as fh:
        return "".join(ch for ch in fh.read(200) if ch.isprintable())
