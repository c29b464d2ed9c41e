"""Keep freed memory in the process for the simulator's commands (glibc only; elsewhere a no-op).

Every numpy temporary of a chunk is a few hundred KiB, above glibc's threshold for giving an
allocation its own mapping, so each one was mapped, faulted in page by page and unmapped again: on the
development VM more than half of a 100k-GPU-year simulation's time was the kernel's (sys 3.3 s of
5 s). Raising the thresholds keeps the freed blocks for the next chunk (64 spares, elastic: 1.68 s ->
1.19 s). It is process-wide, so only the command-line entry points call it, never ``simulate``.
"""

from __future__ import annotations

import ctypes
import ctypes.util

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 256 << 20  # allocations above this still get their own mapping
TRIM_THRESHOLD = 512 << 20  # free memory above this at the heap's top goes back to the system


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to reuse freed blocks instead of mapping each large one anew; True if set."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
