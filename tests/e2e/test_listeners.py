"""A single-node run listens on loopback only: the agent hosts the workers' store on a socket bound
to 127.0.0.1 and held from bind to close (no bind-and-release race), and no worker opens a
listener on every interface."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stalwart.chaos.soak import read_events
from stalwart.events import StepCompleted, WorkersStarted

pytestmark = pytest.mark.e2e


def _listening(pids: set[int]) -> list[tuple[str, int]]:
    """(local address, port) of every TCP listener owned by ``pids``."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                addr, port = cols[1].split(":")
                found.append(
                    (
                        addr
                        if width == 32
                        else ".".join(str(int(addr[i : i + 2], 16)) for i in (6, 4, 2, 0)),
                        int(port, 16),
                    )
                )
    return found


def _descendants(pid: int) -> set[int]:
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        try:
            kids = {int(x) for x in Path(f"/proc/{p}/task/{p}/children").read_text().split()}
        except OSError:
            continue
        todo.extend(kids - out)
        out |= kids
    return out


def test_single_node_run_listens_on_loopback_only(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "stalwart.cli",
        "run",
        "-q",
        "--no-report",
        "--redirects",
        "3",
        "--nproc-per-node",
        "2",
        "--run-dir",
        str(tmp_path),
        "-m",
        "stalwart.examples.charlm",
        "--corpus-bytes",
        "300000",
        "--log-every",
        "0",
        "--steps",
        "400",
        "--checkpoint-every",
        "0",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 180
        while time.time() < deadline and not any(isinstance(e, StepCompleted) for e in read_events(tmp_path)):
            time.sleep(0.5)
        (started,) = [e for e in read_events(tmp_path) if isinstance(e, WorkersStarted)]
        workers = set(started.pids)
        below = _descendants(proc.pid)  # the workers and, on the warm path, the fork server
        assert len(workers) == 2 and workers <= below, (workers, below)
        found = _listening({proc.pid, *below})
    finally:
        proc.terminate()
        proc.communicate(timeout=120)
    assert found, "the agent hosts the workers' store"
    wide = [
        (a, p)
        for a, p in found
        if a != "127.0.0.1" and a != "0" * 31 + "1" and a != "00000000000000000000000001000000"
    ]
    assert not wide, f"listeners beyond loopback: {wide}"
