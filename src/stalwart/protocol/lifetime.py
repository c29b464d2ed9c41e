"""A worker's lifetime is tied to its agent's: the one place that asks the kernel for it."""

from __future__ import annotations

import ctypes
import signal

_PR_SET_PDEATHSIG = 1
_PR_GET_PDEATHSIG = 2
_PR_SET_CHILD_SUBREAPER = 36

EXIT_ORPHANED = 70  # a worker whose agent is already gone exits at once, with this code


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _prctl(option: int, value: int) -> bool:
    libc = _libc()
    try:
        return libc is not None and libc.prctl(option, value, 0, 0, 0) == 0
    except AttributeError:  # not Linux: nothing to tie
        return False


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` when this process's parent (thread) exits; False if it cannot."""
    return set_parent_death_signal(int(sig))


def set_parent_death_signal(sig: int) -> bool:
    """The signal the kernel sends this process when its parent exits (0: none); False if it cannot."""
    return _prctl(_PR_SET_PDEATHSIG, int(sig))


def parent_death_signal() -> int | None:
    """The signal this process gets when its parent exits (0: none), or None where it cannot be read."""
    libc = _libc()
    out = ctypes.c_int(0)
    try:
        if libc is None or libc.prctl(_PR_GET_PDEATHSIG, ctypes.byref(out), 0, 0, 0) != 0:
            return None
    except AttributeError:
        return None
    return out.value


def become_subreaper() -> bool:
    """Adopt orphaned descendants (the fork server's workers reparent to the agent)."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)
