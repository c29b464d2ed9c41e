"""A worker's lifetime is tied to its agent's: the one place that asks the kernel for it."""

from __future__ import annotations

import ctypes
import signal

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux: nothing to tie
        return False


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` when this process's parent (thread) exits; False if it cannot."""
    return _prctl(_PR_SET_PDEATHSIG, int(sig))


def become_subreaper() -> bool:
    """Adopt orphaned descendants (the fork server's workers reparent to the agent)."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)
