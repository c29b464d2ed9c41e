"""Two ``stalwart run`` agents over loopback with ``--rdzv-backend stalwart`` (Stalwart's own
rendezvous, launch/rendezvous/round_rendezvous.py): a node that arrives while the first trains alone
waits, the running agent sees it (``num_nodes_waiting``), both go on in one group of two and train to
the end. (A round at a fixed size, min = max, is covered on a real TCPStore in
tests/unit/test_round_rendezvous.py; one e2e run keeps the suite's time.)"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from netutil import free_port
from stalwart.events import AttemptStarted, JobEnded

from .runner import EXAMPLE, events, events_so_far, wait_listening

pytestmark = pytest.mark.e2e


def _agent(run_dir, node, port, steps, nnodes, *extra):
    cmd = [
        sys.executable, "-m", "stalwart.cli", "run", "-q", "--nnodes", nnodes, "--nproc-per-node", "1",
        "--rdzv-backend", "stalwart", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "round-e2e",
        "--run-dir", str(run_dir), "--node-name", node, "--hang-floor", "3", *extra, *EXAMPLE,
        "--steps", str(steps), "--checkpoint-every", "5",
    ]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_a_late_node_joins_the_running_agent_through_num_nodes_waiting(tmp_path):
    port, steps = free_port(), 150
    extra = ("--no-in-place",)  # the rendezvous, not an in-place grow, takes the newcomer
    a = _agent(tmp_path, "n0", port, steps, "1:2", *extra)
    wait_listening(port, a)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # n0 trains alone in round 0 before n1 exists
        if any(e.kind == "StepCompleted" for e in events_so_far(tmp_path)):
            break
        assert a.poll() is None, a.communicate()[0]
        time.sleep(0.5)
    b = _agent(tmp_path, "n1", port, steps, "1:2", *extra)
    out_b, _ = b.communicate(timeout=600)
    out_a, _ = a.communicate(timeout=600)
    assert a.returncode == 0 and b.returncode == 0, out_a + out_b
    starts = sorted(events(tmp_path, AttemptStarted), key=lambda e: e.ts)
    assert starts[0].node == "n0" and starts[0].num_nodes == 1, "n0 started alone"
    joined = [e for e in starts if e.num_nodes == 2]
    assert {e.node for e in joined} == {"n0", "n1"}, "both nodes ran in one group after n1 arrived"
    ends = events(tmp_path, JobEnded)
    assert {e.node for e in ends} == {"n0", "n1"} and all(e.outcome == "succeeded" for e in ends), ends
