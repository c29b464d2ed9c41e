"""When the current process started, on the wall clock."""

from __future__ import annotations

import os
import time


def process_start() -> float:
    """/proc/self/stat gives the start in clock ticks since boot and /proc/uptime the seconds since
    boot (10 ms resolution): their difference is this process's age."""
    try:
        with open("/proc/self/stat") as fh:
            ticks = int(fh.read().rpartition(")")[2].split()[19])
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        now = time.time()
        age = uptime - ticks / os.sysconf("SC_CLK_TCK")
        return now - age if 0 <= age < 60 else now
    except (OSError, ValueError, IndexError):
        return time.time()
