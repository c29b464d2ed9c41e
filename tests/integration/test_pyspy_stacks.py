"""A stopped Python process's stack, read from outside with py-spy (diagnose/pyspy.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stalwart.diagnose.pyspy import dump_stopped, process_state, py_spy, stopped_stacks

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(py_spy() is None, reason="py-spy is not installed"),
]

SCRIPT = """
import sys, time
def waiting_in_zero_stack_probe():
    print("ready", flush=True)
    while True:
        time.sleep(0.05)
waiting_in_zero_stack_probe()
"""


@pytest.fixture
def sleeper(tmp_path: Path):
    path = tmp_path / "zero_stack_probe.py"
    path.write_text(SCRIPT)
    proc = subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait()


def _wait_state(pid: int, want: str) -> None:
    deadline = time.monotonic() + 10
    while process_state(pid) != want and time.monotonic() < deadline:
        time.sleep(0.02)
    assert process_state(pid) == want


def test_a_stopped_process_stack_is_read_from_outside(sleeper: subprocess.Popen):
    assert dump_stopped(sleeper.pid, 30.0) is None  # running: faulthandler's job, not py-spy's
    os.kill(sleeper.pid, signal.SIGSTOP)
    _wait_state(sleeper.pid, "T")
    text = dump_stopped(sleeper.pid, 30.0)
    assert text is not None and "waiting_in_zero_stack_probe (zero_stack_probe.py:" in text, text
    got = stopped_stacks({3: sleeper.pid}, 30.0)
    assert list(got) == [3] and "zero_stack_probe.py" in got[3], got
    assert process_state(sleeper.pid) == "T"  # reading it did not resume it


def test_a_gone_process_has_no_stack():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert process_state(p.pid) == "" and dump_stopped(p.pid, 5.0) is None
