"""Every listener Stalwart opens, audited from /proc: a single-node run (the agent hosts the workers'
store on a socket bound to 127.0.0.1 and held from bind to close, its --metrics-port exporter, and
no worker listening on every interface), the active health check's all-reduce store, the peer store,
and the `metrics serve`, `dashboard` and `notify serve` commands, all on loopback by default; an
address beyond loopback is announced with a warning. The run also leaves its webhook URL out of the
ledger and its run directory private."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from netutil import free_port
from proctree import descendants
from stalwart.chaos.soak import read_events
from stalwart.checkpoint.peer_store import PeerStore
from stalwart.events import StepCompleted, WorkersStarted
from stalwart.health.active import measure_allreduce, probe_store

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


SECRET_HOOK = "http://127.0.0.1:9/services/T000/B000/listenersHookSecret"  # port 9: refused at once


def _wide(found: list[tuple[str, int]]) -> list[tuple[str, int]]:
    return [
        (a, p) for a, p in found if a not in ("127.0.0.1", "0" * 31 + "1", "00000000000000000000000001000000")
    ]


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
    cmd[cmd.index("run") + 1 : cmd.index("run") + 1] = ["--metrics-port", "0"]  # stalwart's, not the script's
    env = dict(os.environ, STALWART_NOTIFY=SECRET_HOOK)  # the webhook from the environment
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline = time.time() + 180
        while time.time() < deadline and not any(isinstance(e, StepCompleted) for e in read_events(tmp_path)):
            time.sleep(0.5)
        (started,) = [e for e in read_events(tmp_path) if isinstance(e, WorkersStarted)]
        workers = set(started.pids)
        below = descendants(proc.pid)  # the workers and, on the warm path, the fork server
        assert len(workers) == 2 and workers <= below, (workers, below)
        found = _listening({proc.pid, *below})
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=120)
    assert len(found) >= 2, f"the agent hosts the workers' store and the exporter: {found}"
    assert not _wide(found), f"listeners beyond loopback: {_wide(found)}"
    assert "WARNING" not in out
    # the webhook URL is in no file of the run (ledgers, logs), only its scheme and host
    files = [f for f in tmp_path.rglob("*") if f.is_file()]
    assert not [f for f in files if b"listenersHookSecret" in f.read_bytes()]
    assert any(b"http://127.0.0.1:9/..." in f.read_bytes() for f in files if "ledger" in f.parts)
    # private: the run directory 0700, run.json and the control blocks 0600
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o700
    private = [tmp_path / "run.json", *(tmp_path / "control").glob("*.bin")]
    assert len(private) >= 2 and {stat.S_IMODE(f.stat().st_mode) for f in private} == {0o600}


def _port_listeners(port: int) -> list[str]:
    """Local addresses listening on ``port``, whoever owns them."""
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            addr, p = cols[1].split(":")
            if cols[3] == "0A" and int(p, 16) == port:
                out.append(addr)
    return out


def test_the_active_health_checks_all_reduce_store_listens_on_loopback_only():
    store = probe_store(0, 1, "127.0.0.1", free_port())
    try:
        assert _port_listeners(store.port) == ["0100007F"], "127.0.0.1 only, not every interface"
    finally:
        del store
    bw, ranks, err = measure_allreduce(world=2, iters=2)  # two real gloo processes meet through it
    assert err == "" and ranks == 2 and bw > 0


def test_the_peer_store_listens_on_its_one_address(tmp_path):
    (tmp_path / "own").mkdir()
    s = PeerStore(node="n0", held=tmp_path / "held", own=tmp_path / "own", host="127.0.0.1", secret=b"k" * 32)
    try:
        s.start()
        assert _port_listeners(s.port) == ["0100007F"]
    finally:
        s.stop()


def _serve(args: list[str]) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "stalwart.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline()


@pytest.mark.parametrize(
    "args",
    [
        ["metrics", "serve", "{run}", "--port", "0"],
        ["dashboard", "{run}", "--port", "0"],
        ["notify", "serve", "--slack", SECRET_HOOK, "--port", "0"],
    ],
    ids=["metrics", "dashboard", "notify"],
)
def test_the_serve_commands_listen_on_loopback_by_default(tmp_path, args):
    (tmp_path / "ledger").mkdir()
    proc, first = _serve([a.replace("{run}", str(tmp_path)) for a in args])
    try:
        found = _listening({proc.pid})
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "http://127.0.0.1:" in first and found and not _wide(found), (first, found)
    assert "WARNING" not in err


def test_an_address_beyond_loopback_is_announced_loudly(tmp_path):
    proc, first = _serve(["notify", "serve", "--slack", SECRET_HOOK, "--port", "0", "--addr", "0.0.0.0"])
    proc.terminate()
    _, err = proc.communicate(timeout=30)
    assert "http://0.0.0.0:" in first
    assert "WARNING: stalwart notify serve listens on EVERY interface" in err
