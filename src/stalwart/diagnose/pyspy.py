"""The Python stack of a stopped rank, read from outside the process with py-spy.

A hang's stacks come from ``faulthandler`` inside each worker (the SDK's, or the bootstrap's): a
rank stopped by SIGSTOP (state ``T``) cannot run it, so its own stack, the one that matters most, was
missing. py-spy (a maintained sampling profiler, installed with Stalwart) reads the interpreter's
memory instead. What works on a stopped process, measured with py-spy 0.4.3 and CPython 3.11:

* ``py-spy dump --pid P`` fails ("Failed to suspend process: unexpected waitpid result
  PtraceEvent(P, SIGSTOP, 128)"): its default mode attaches with ptrace to pause the process, and a
  process already in group-stop answers the attach with a stop event py-spy does not expect.
* ``--native`` needs that same ptrace pause to unwind C frames, so native frames (gloo/NCCL waits)
  are out of reach for a stopped process; py-spy refuses ``--native`` with ``--nonblocking``.
* ``py-spy dump --nonblocking --pid P`` works: it reads the memory with ``process_vm_readv`` and never
  pauses the process, and a stopped process cannot change its frames under the read.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

STOPPED_STATES = ("T", "t")


STOPPED = (
    "(stopped, state T: read from outside by py-spy dump --nonblocking)"  # a stopped rank's stack begins so
)


def py_spy() -> str | None:
    """The py-spy executable: on PATH, or next to this interpreter (a virtualenv's bin/)."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() else None


def process_state(pid: int) -> str:
    """The state letter of /proc/PID/stat ('' when the process is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def dump_stopped(pid: int, timeout_s: float, exe: str | None = None) -> str | None:
    """The Python stack of the stopped process ``pid`` (every thread), or None when py-spy is not
    installed, the process is not stopped, or py-spy gives nothing within ``timeout_s``."""
    exe = exe or py_spy()
    if exe is None or process_state(pid) not in STOPPED_STATES:
        return None
    try:
        p = subprocess.run(
            [exe, "dump", "--nonblocking", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if p.returncode != 0 or "Thread " not in p.stdout:
        return None
    return f"{STOPPED}\n{p.stdout}"


def stopped_stacks(pids: Mapping[int, int], timeout_s: float) -> dict[int, str]:
    """Rank -> stack for the ranks of ``pids`` (rank -> pid) that are stopped, within ``timeout_s``
    each; ranks py-spy cannot read are left out."""
    exe = py_spy()
    if exe is None:
        return {}
    out = {}
    for rank, pid in pids.items():
        text = dump_stopped(pid, timeout_s, exe)
        if text is not None:
            out[rank] = text
    return out
