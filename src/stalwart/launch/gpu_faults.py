"""Device faults this node's GPUs reported during the attempt: an input of the in-place ladder.

A survivor of an in-place re-formation keeps its process and its CUDA context. When a GPU of the
node reported an Xid that the health rules answer with a GPU reset or a power cycle (the
``reset_gpu`` and ``irrecoverable`` lists of health/rules.yaml), that survivor may be running on a
device that is no longer sound, so the ladder restarts the whole group instead and the health gate
re-checks the node before any worker starts on it (policy/inplace.py).

The kernel log comes from ``--kernel-log`` when given (a file of dmesg lines), else from /dev/kmsg
read without blocking. Only lines stamped at or after the attempt's start count, so an old Xid
that the health gate already judged does not stop every later re-formation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..diagnose.kill_witness import read_kmsg
from ..errors import TelemetryError
from ..health.kernel_log import MAX_KERNEL_LOG_BYTES, parse_kernel_log, read_uptime
from ..health.rules import load_rules
from ..inputs import read_text_tail

SEVERE_LISTS = ("reset_gpu", "irrecoverable")
MAX_SHOWN = 3


def severe_xids(lines: Iterable[str], since_boot_s: float, severe: frozenset[int]) -> tuple[str, ...]:
    """The Xids in ``lines`` stamped at or after ``since_boot_s`` (seconds since boot) whose code is in
    ``severe``, as one description each (undated lines cannot be placed in the attempt: skipped)."""
    obs = parse_kernel_log("\n".join(lines))
    return tuple(
        f"GPU {x.bdf} reported Xid {x.xid} ({x.text.strip()[:80]})"
        for x in obs.xids
        if x.xid in severe and x.t_boot is not None and x.t_boot >= since_boot_s
    )


def severe_codes() -> frozenset[int]:
    """The Xid codes the shipped health rules answer with a GPU reset or a power cycle."""

    lists = load_rules().xid_lists
    return frozenset().union(*(lists.get(name, frozenset()) for name in SEVERE_LISTS))


def _kernel_lines(path: Path | None) -> Sequence[str]:
    if path is not None:
        try:
            text, _ = read_text_tail(path, MAX_KERNEL_LOG_BYTES, "kernel log", error=TelemetryError)
        except TelemetryError:
            return ()
        return text.splitlines()

    return read_kmsg() or ()


@dataclass
class XidWatch:
    """Called once per in-place decision: the severe Xids since ``started`` (wall time)."""

    started: float
    kernel_log: Path | None = None
    now: Callable[[], float] = time.time
    uptime: Callable[[], float | None] = read_uptime
    read: Callable[[Path | None], Sequence[str]] = _kernel_lines
    _codes: frozenset[int] | None = None

    def __call__(self) -> tuple[str, ...]:
        up = self.uptime()
        if up is None:
            return ()
        boot = self.now() - up  # the wall time of boot
        if self._codes is None:
            self._codes = severe_codes()
        return severe_xids(self.read(self.kernel_log), self.started - boot, self._codes)[:MAX_SHOWN]
