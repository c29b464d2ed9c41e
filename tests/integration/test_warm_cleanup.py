"""Warm starts leave nothing behind: after a finished run, a user error (exit 3), a SIGTERM (exit 76)
and a SIGKILLed agent, neither the fork server nor a worker is still running, and no shared-memory
entry named after one of its processes is left in /dev/shm. One worker per run keeps it small."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from stalwart.events import DecisionTaken, JobEnded
from stalwart.ledger import read_merged

pytestmark = pytest.mark.integration

SCRIPT = textwrap.dedent("""
    import os, sys, time
    import torch
    mode = sys.argv[1]
    open(os.path.join(sys.argv[2], f"pid-{os.getpid()}"), "w").close()
    if mode == "raise":
        raise ValueError("a user bug")
    if mode == "sleep":
        time.sleep(120)
""")


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _servers(label: str) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = (
                    Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                )
            except OSError:
                continue
            if "fork_server_main" in cmd and label in cmd and _running(int(entry)):
                out.append(int(entry))
    return out


def _wait_gone(pids: list[int], timeout_s: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(_running(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if _running(p)]


def _start(tmp_path: Path, mode: str) -> tuple[subprocess.Popen, Path, Path]:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    pids = tmp_path / "pids"
    pids.mkdir()
    run_dir = tmp_path / "run"
    agent = subprocess.Popen(
        [sys.executable, "-m", "stalwart.cli", "run", "-q", "--run-dir", str(run_dir), "--stop-grace", "1",
         "--backoff", "0", str(script), mode, str(pids)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    return agent, run_dir, pids


def _wait_for_worker(pids: Path, agent: subprocess.Popen, timeout_s: float = 180.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and agent.poll() is None:
        found = list(pids.glob("pid-*"))
        if found:
            return int(found[0].name[4:])
        time.sleep(0.05)
    raise AssertionError("the worker never started")


@pytest.mark.parametrize(
    ("mode", "stop", "code"),
    [("ok", None, 0), ("raise", None, 3), ("sleep", signal.SIGTERM, 76), ("sleep", signal.SIGKILL, -9)],
    ids=["finish", "user-error", "sigterm", "agent-killed"],
)
def test_no_fork_server_worker_or_shared_memory_left(tmp_path, mode, stop, code):
    shm_before = set(os.listdir("/dev/shm"))
    agent, run_dir, pids = _start(tmp_path, mode)
    label = f"run_dir={run_dir}"
    if stop is not None:
        _wait_for_worker(pids, agent)
        servers = _servers(label)
        assert servers, "a fork server serves this run while it is running"
        agent.send_signal(stop)
    else:
        servers = []
    try:
        assert agent.wait(timeout=300) == code, agent.stderr.read().decode()[-2000:]
    finally:
        if agent.poll() is None:
            agent.kill()
    workers = [int(p.name[4:]) for p in pids.glob("pid-*")]
    assert workers, "at least one worker ran"
    assert _wait_gone(workers + servers + _servers(label)) == [], "a process of the run outlived its agent"
    # torch's shared-memory segments and Stalwart's memory tier are named after a pid or the job
    ours = [str(p) for p in [agent.pid, *workers, *servers]] + [run_dir.parent.name]
    left = {n for n in set(os.listdir("/dev/shm")) - shm_before if any(tag in n for tag in ours)}
    assert not left, f"shared memory left behind: {left}"
    if stop is not signal.SIGKILL:  # a killed agent writes nothing more; the others say how they started
        evs = read_merged(run_dir)
        starts = [e for e in evs if isinstance(e, DecisionTaken) and e.action.startswith("start_")]
        assert starts and all(e.action == "start_warm" for e in starts), [e.reason for e in starts]
        assert any(isinstance(e, JobEnded) for e in evs)
    if mode == "raise":  # the warm worker's stderr went through the agent's pipes into the run log
        logs = "".join(p.read_text() for p in (run_dir / "logs").glob("*.log"))
        assert "ValueError: a user bug" in logs and "Traceback" in logs
