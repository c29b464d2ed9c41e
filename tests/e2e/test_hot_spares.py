"""Valid-size continuation with real agents: 4 nodes lose one, continue at 2 with a hot spare,
and the spare steps in when another node fails. Plus the health gate excluding a sick node."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from netutil import free_port
from stalwart.checkpoint.manifest import verify
from stalwart.events import AttemptStarted, DecisionTaken, JobEnded

from .runner import EXAMPLE, events, stalwart, wait_listening

pytestmark = pytest.mark.e2e
FIXTURES = Path(__file__).parents[1] / "fixtures" / "gpu" / "h100_derived"


def test_spare_steps_in_at_a_valid_world_size(tmp_path):
    port, steps = free_port(), 40
    chaos = ["--chaos", "kill-agent@node=3,step=10", "--chaos", "kill-agent@node=1,step=25"]
    procs = {}
    for i in range(4):
        cmd = [
            sys.executable,
            "-m",
            "stalwart.cli",
            "run",
            "-q",
            "--nnodes",
            "2:4",
            "--nproc-per-node",
            "1",
            "--valid-sizes",
            "pow2",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            "spares",
            # the four agents start seconds apart on a busy machine (importing torch alone can take
            # tens of seconds there); the default 3 s last call would close the first round at 2
            "--rdzv-conf",
            "last_call_timeout=45",
            "--run-dir",
            str(tmp_path),
            "--node-name",
            f"n{i}",
            # torch orders a round's nodes by (address, pid) and pids wrap on a busy machine: an address
            # per node keeps n0 (the store's host) group rank 0, so the chaos never kills the store
            "--local-addr",
            f"127.0.0.{i + 1}",
            "--hang-floor",
            "3",
            *chaos,
            *EXAMPLE,
            "--steps",
            str(steps),
            "--checkpoint-every",
            "5",
        ]
        procs[f"n{i}"] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if i == 0:
            wait_listening(port, procs["n0"])  # n0 hosts the rendezvous store
    outs = {n: p.communicate(timeout=600)[0] for n, p in procs.items()}
    codes = {n: p.returncode for n, p in procs.items()}
    killed = [n for n, c in codes.items() if c == -signal.SIGKILL]
    survivors = [n for n, c in codes.items() if c == 0]
    assert len(killed) == 2 and len(survivors) == 2, (codes, outs)
    starts = events(tmp_path, AttemptStarted)
    sizes = [e.world_size for e in sorted(starts, key=lambda e: e.ts)]
    assert sizes[0] == 4 and 3 not in sizes, f"never ran at an invalid size: {sizes}"
    standby = [e for e in events(tmp_path, DecisionTaken) if e.action == "standby"]
    assert len(standby) == 1, (
        "after losing one of 4 nodes, one of the 3 left stands by (3 is not a power of two)"
    )
    spare = standby[0].node
    assert spare in survivors
    stepped_in = [e for e in starts if e.node == spare and e.ts > standby[0].ts]
    assert stepped_in and stepped_in[0].world_size == 2, "the spare joined the group when another node failed"
    ends = [e for e in events(tmp_path, JobEnded) if e.node in survivors]
    assert {e.outcome for e in ends} == {"succeeded"}
    manifest, reason = verify(tmp_path / "checkpoints" / f"step-{steps:09d}")
    assert manifest is not None and manifest.world_size == 2, reason


def test_health_gate_excludes_a_sick_node(tmp_path):
    run = stalwart(
        "run",
        "--nproc-per-node",
        "1",
        "--run-dir",
        str(tmp_path),
        "--health-fixture",
        str(FIXTURES / "gpu_lost"),
        *EXAMPLE,
        "--steps",
        "3",
    )
    assert run.code == 75, run.out + run.err
    end = events(tmp_path, JobEnded)[-1]
    assert end.outcome == "node_unhealthy" and "fell off the bus" in end.verdict and end.requeue_helps
    assert not events(tmp_path, AttemptStarted), "no worker started on the sick node"
    nodes = stalwart("nodes", "--state-dir", str(tmp_path / "health"), "--json")
    assert nodes.code == 0, nodes.err
    assert '"quarantined"' in nodes.out
