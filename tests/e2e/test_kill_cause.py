"""A worker killed by the kernel's OOM killer (a real memory cgroup limit) is a memory incident; one
killed with SIGKILL from outside is "killed from outside the job"; neither is blamed on user code."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stalwart.events import IncidentRaised

from .runner import events

pytestmark = pytest.mark.e2e

SCRIPT = str(Path(__file__).parent / "user_scripts" / "memory_hog.py")


def _own_memory_cgroup() -> Path | None:
    """This process's memory cgroup directory (v2 with the memory controller, else v1)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hid, controllers, path = line.split(":", 2)
        if hid == "0" and controllers == "":
            ctl = Path("/sys/fs/cgroup") / path.lstrip("/") / "cgroup.controllers"
            if ctl.is_file() and "memory" in ctl.read_text().split():
                return ctl.parent
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hid, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            d = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            if d.is_dir():
                return d
    return None


@pytest.fixture
def memory_cgroup() -> Iterator[Path]:
    """A child memory cgroup limited to 96 MiB; its ``cgroup.procs`` is what a process writes to join."""
    parent = _own_memory_cgroup()
    if os.geteuid() != 0 or parent is None or not os.access(parent, os.W_OK):
        pytest.skip("needs root and a writable memory cgroup")
    child = parent / f"exact-oom-{os.getpid()}"
    child.mkdir()
    try:
        limit = str(96 * 1024 * 1024)
        if (child / "memory.max").exists():
            (child / "memory.max").write_text(limit)
            if (child / "memory.swap.max").exists():
                (child / "memory.swap.max").write_text("0")
        else:
            (child / "memory.limit_in_bytes").write_text(limit)
        yield child
    finally:
        for _ in range(100):  # the killed worker leaves the cgroup when it is reaped
            try:
                child.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def _run(tmp_path: Path, env_extra: dict[str, str]) -> subprocess.Popen:
    env = {**os.environ, "HOG_PID_DIR": str(tmp_path), **env_extra}
    return subprocess.Popen(
        [sys.executable, "-m", "stalwart.cli", "run", "-q", "--no-health-gate", "--nproc-per-node", "2",
         "--max-restarts", "0", "--stop-grace", "2", "--run-dir", str(tmp_path / "run"), SCRIPT],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _incident(tmp_path: Path, p: subprocess.Popen) -> IncidentRaised:
    out, err = p.communicate(timeout=240)
    crashes = [i for i in events(tmp_path / "run", IncidentRaised) if 1 in i.ranks]
    assert crashes, out[-3000:] + err[-3000:]
    return crashes[0]


def test_a_real_oom_kill_is_a_memory_incident(tmp_path: Path, memory_cgroup: Path):
    p = _run(tmp_path, {"HOG_CGROUP_PROCS": str(memory_cgroup / "cgroup.procs")})
    inc = _incident(tmp_path, p)
    assert "killed by the kernel OOM killer" in inc.cause, inc
    assert inc.component == "host_memory" and inc.fault_class != "unknown", inc
    pid = (tmp_path / "rank1.pid").read_text()
    assert any(f"Killed process {pid}" in e for e in inc.evidence), inc.evidence


def test_an_outside_sigkill_is_not_user_code(tmp_path: Path):
    p = _run(tmp_path, {})
    pid_file = tmp_path / "rank1.pid"
    deadline = time.monotonic() + 180
    while not pid_file.exists() and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.1)
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    inc = _incident(tmp_path, p)
    assert "killed from outside the job" in inc.cause, inc
    assert (inc.fault_class, inc.component) == ("unknown", "external"), inc
