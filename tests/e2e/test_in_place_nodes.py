"""In-place recovery across nodes (two agents on loopback, two ranks each, DDP on gloo under
``Session.run``): rank 1 on node n0 is SIGKILLed mid-run. n0's agent replaces only that rank and
announces the new generation in the round's worker store; n1's agent joins it, so every other rank
keeps its process, the run ends bit-identical to an uninterrupted one and no rank restarts whole."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from netutil import free_port
from stalwart.events import DecisionTaken, JobEnded, ReformedInPlace, StepCompleted

from .runner import events, same_params, wait_listening

pytestmark = pytest.mark.e2e
SCRIPT = str(Path(__file__).parent / "sdk_scripts" / "inplace_ddp.py")
STEPS, NODES, PER_NODE = 40, 2, 2
RANKS = NODES * PER_NODE


def _two_nodes(tmp: Path, *extra: str) -> dict[str, str]:
    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port()
    procs = {}
    for i in range(NODES):
        cmd = [
            sys.executable,
            "-m",
            "stalwart.cli",
            "run",
            "-q",
            "--nnodes",
            str(NODES),
            "--nproc-per-node",
            str(PER_NODE),
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            "inplace-nodes",
            "--run-dir",
            str(tmp / "run"),
            "--node-name",
            f"n{i}",
            *extra,
            SCRIPT,
            str(STEPS),
            str(tmp),
        ]
        procs[f"n{i}"] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if i == 0:
            wait_listening(port, procs["n0"])  # n0 hosts the rendezvous store
    try:
        outs = {n: p.communicate(timeout=420)[0] for n, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    for n, p in procs.items():
        assert p.returncode == 0, (n, outs)
    return outs


def _pids(tmp: Path) -> dict[int, list[int]]:
    return {r: [int(x) for x in (tmp / f"pids-rank{r}.txt").read_text().split()] for r in range(RANKS)}


@pytest.mark.timeout(900)
def test_a_rank_killed_on_one_node_is_replaced_in_place_and_the_other_node_joins(tmp_path):
    _two_nodes(tmp_path / "ref")
    _two_nodes(tmp_path / "cut", "--chaos", "crash@rank=1,step=17")
    cut = tmp_path / "cut"
    assert same_params(cut / "final.pt", tmp_path / "ref" / "final.pt"), (
        "in-place recovery changed the result"
    )
    pids = _pids(cut)
    assert len(pids[1]) == 2 and pids[1][0] != pids[1][1], pids  # the killed rank was replaced
    for r in (0, 2, 3):  # every other rank ran train() twice in the same process, on both nodes
        assert len(pids[r]) == 2 and pids[r][0] == pids[r][1], pids
    run = cut / "run"
    [done] = events(run, ReformedInPlace)
    assert done.node == "n0" and done.ranks == (1,) and done.lost_steps == 0 and done.bytes_moved > 0
    joined = [e for e in events(run, DecisionTaken) if e.action == "joined_in_place"]
    assert [e.node for e in joined] == ["n1"] and "node n0" in joined[0].reason, joined
    assert {e.attempt for e in events(run, StepCompleted)} == {0}  # no whole-group restart on either node
    assert {e.node: e.exit_code for e in events(run, JobEnded)} == {"n0": 0, "n1": 0}
