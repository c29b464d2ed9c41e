"""Straggler -> action with real agents (issue 14's acceptance): "a straggler that costs more than a
restart is excluded and the job continues at the next valid size; a mild one is left alone, both
with reasons".

Two agents on this machine, 2 ranks each, ``--straggler-action act``. Rank 3 (on the second node) is
first slowed 2x for 40 steps: flagged, but excluding its node would halve the world, which costs more
than the slowdown, so it is kept with the costs as the reason (and cleared once it recovers). From
step 80 it is slowed 8x: now its node excludes itself (quarantined in the node records), and the
first node goes on alone at world size 2 and finishes. One slowed rank at a time: the chaos slowdown
is relative to the rank's own step time, which includes waiting for another slowed rank. No timing
assertion: detection is debounced over windows of steps."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from netutil import free_port
from stalwart.checkpoint.manifest import verify
from stalwart.events import AttemptStarted, DecisionTaken, IncidentRaised, JobEnded
from stalwart.exit_codes import EXIT_INFRA
from stalwart.health.node_store import HealthStore

from .runner import events, wait_listening

pytestmark = pytest.mark.e2e
SCRIPT = str(Path(__file__).parent / "sdk_scripts" / "checkpointed.py")
STEPS = 250


def test_a_costly_straggler_is_excluded_and_a_mild_one_kept(tmp_path):
    port = free_port()
    procs = {}
    for i in range(2):
        cmd = [
            sys.executable,
            "-m",
            "stalwart.cli",
            "run",
            "-q",
            "--nnodes",
            "1:2",
            "--nproc-per-node",
            "2",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            "strag",
            # both agents must make the first round on a busy machine (importing torch is slow there)
            "--rdzv-conf",
            "last_call_timeout=30",
            "--run-dir",
            str(tmp_path),
            "--node-name",
            f"n{i}",
            # torch orders a round's nodes by (address, pid) and pids wrap on a busy machine: a loopback
            # address per node keeps n1 group rank 1, so rank 3 (the straggler) is on n1
            "--local-addr",
            f"127.0.0.{i + 1}",
            "--hang-floor",
            "5",
            "--straggler-action",
            "act",
            "--straggler-recovery",
            "5",
            "--chaos",
            "slow@rank=3,factor=2,to=39,id=mild",
            "--chaos",
            "slow@rank=3,factor=8,from=80,id=heavy",
            SCRIPT,
            str(STEPS),
        ]
        procs[f"n{i}"] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if i == 0:
            wait_listening(port, procs["n0"])  # n0 hosts the rendezvous store
    outs = {n: p.communicate(timeout=600)[0] for n, p in procs.items()}
    codes = {n: p.returncode for n, p in procs.items()}
    first = {e.node: e for e in events(tmp_path, AttemptStarted) if e.attempt == 0}
    assert first["n1"].group_rank == 1 and first["n1"].world_size == 4, (first, outs)

    # the costly straggler: its node excluded itself, with the costs as the reason, and is quarantined
    assert codes["n1"] == EXIT_INFRA, outs
    ends = {e.node: e for e in events(tmp_path, JobEnded)}
    assert ends["n1"].outcome == "node_excluded" and "straggler" in ends["n1"].verdict
    decisions = events(tmp_path, DecisionTaken)
    (excl,) = [d for d in decisions if d.action == "exclude_quarantine"]
    assert excl.node == "n1" and "rank 3" in excl.reason and "costs" in excl.reason, excl.reason
    raised = events(tmp_path, IncidentRaised)
    (inc,) = [e for e in raised if e.rule == "policy:straggler-action"]
    assert inc.node == "n1" and inc.component == "straggler" and inc.action_taken and inc.ranks == (3,)
    # the survivor's lost peer is explained by the exclusion, not left as a cause-less comm failure
    assert not [e for e in raised if e.rule == "cross_layer:no-cause"], raised
    assert [e for e in raised if e.rule == "cross_layer:node-excluded" and e.nodes == ("n1",)], raised
    assert HealthStore(tmp_path / "health").record("n1").state.value == "quarantined"

    # the job went on without it at the next valid size and finished
    assert codes["n0"] == 0 and ends["n0"].outcome == "succeeded", outs["n0"]
    later = [e for e in events(tmp_path, AttemptStarted) if e.node == "n0" and e.attempt > 0]
    assert later and later[-1].world_size == 2
    manifest, reason = verify(tmp_path / "checkpoints" / f"step-{STEPS:09d}")
    assert manifest is not None and manifest.world_size == 2, reason

    # the mild one, earlier: kept, with the costs as the reason, before the exclusion
    (kept,) = [d for d in decisions if d.action == "keep"]
    assert kept.node == "n1" and kept.ts < excl.ts, decisions
    assert "rank 3" in kept.reason and "keep going" in kept.reason and "costs" in kept.reason, kept.reason
