"""Silent data corruption across nodes: three real agents of one rank each (``--nnodes 2:3``, any size
valid), the chaos plan flips a bit of rank 1's weights on n1. The cross-replica check names rank 1 by
majority, every replica rolls back to the clean checkpoint, n1's agent quarantines its node and, since
n0 and n2 still make a valid world size, leaves the running attempt at once (``sdc_exclude``, exit
75), saying so on its liveness line. n0 knows at once that n1 left (no heartbeat silence to wait
out), the other two shrink in place without it and finish with replicas that agree, and nothing is
found corrupted again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from netutil import free_port
from stalwart.events import DecisionTaken, IncidentRaised, JobEnded
from stalwart.events.integrity import SilentCorruption
from stalwart.exit_codes import EXIT_INFRA
from stalwart.health.node_store import HealthStore

from .runner import events, wait_listening

pytestmark = pytest.mark.e2e

SCRIPT = str(Path(__file__).parent / "sdk_scripts" / "sdc_ddp.py")
STEPS, FLIP_STEP = 60, 30


def _three_nodes(
    tmp_path: Path, flip_rank: int, addr: dict[str, int]
) -> tuple[dict[str, int], dict[str, str]]:
    """Three agents of one rank on loopback; ``addr``: each node's last address byte (torch orders a
    round's nodes by address, so it gives each node its group rank); n0 hosts the rendezvous store."""
    port, run, out = free_port(), tmp_path / "run", tmp_path / "out"
    out.mkdir()
    procs = {}
    try:
        for i in range(3):
            cmd = [
                sys.executable, "-m", "stalwart.cli", "run", "-q", "--no-health-gate",
                "--nnodes", "2:3", "--nproc-per-node", "1", "--valid-sizes", "any",
                "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "sdc-nodes",
                # the first round waits for all three (importing torch is slow on a busy machine)
                "--rdzv-conf", "last_call_timeout=60",
                "--run-dir", str(run), "--node-name", f"n{i}",
                "--local-addr", f"127.0.0.{addr[f'n{i}']}",
                "--chaos", f"bitflip@rank={flip_rank},step={FLIP_STEP}",
                SCRIPT, str(STEPS), str(out),
            ]  # fmt: skip
            procs[f"n{i}"] = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            if i == 0:
                wait_listening(port, procs["n0"])  # n0 hosts the rendezvous store
        outs = {n: p.communicate(timeout=600)[0] for n, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return {n: p.returncode for n, p in procs.items()}, outs


@pytest.mark.timeout(900)
def test_the_corrupting_node_leaves_the_running_job_and_the_others_finish(tmp_path):
    run, out = tmp_path / "run", tmp_path / "out"
    codes, outs = _three_nodes(tmp_path, 1, {"n0": 1, "n1": 2, "n2": 3})  # n1 is rank 1
    assert codes == {"n0": 0, "n1": EXIT_INFRA, "n2": 0}, (codes, outs)

    evs = events(run)
    found = [e for e in evs if isinstance(e, SilentCorruption)]
    first = found[0]
    assert first.verdict == "odd_one_out" and first.suspect_ranks == (1,) and first.suspect_nodes == ("n1",)
    assert first.action == "rollback" and first.to_step <= FLIP_STEP, first
    # every rank reported that one finding; nothing was found corrupted after it
    assert {(e.step, e.verdict) for e in found} == {(first.step, "odd_one_out")}, found

    # n1's agent quarantined its node and left the running attempt; the job ended for it as excluded
    decisions = [e for e in evs if isinstance(e, DecisionTaken) and e.node == "n1"]
    assert [d.action for d in decisions if d.action.startswith("sdc_")] == ["sdc_quarantine", "sdc_exclude"]
    assert "goes on at 2 node(s)" in decisions[-1].reason, decisions[-1].reason
    rec = HealthStore(run / "health").record("n1")
    assert rec.state.value == "quarantined" and rec.fault_key == "sdc" and rec.needs_human, rec
    ends = {e.node: e for e in evs if isinstance(e, JobEnded)}
    assert ends["n1"].outcome == "node_excluded" and "silently" in ends["n1"].verdict, ends["n1"]
    assert ends["n0"].outcome == ends["n2"].outcome == "succeeded", ends

    # n0, which watches the others, knew at once that n1 left on purpose (its liveness line said so):
    # no heartbeat silence to wait out, and the incident says it left, not that it died or fell silent
    (shrunk,) = [e for e in evs if isinstance(e, DecisionTaken) and e.action == "shrink_in_place"]
    assert shrunk.node == "n0" and "its agent left the job on purpose" in shrunk.reason, shrunk.reason
    (left,) = [e for e in evs if isinstance(e, IncidentRaised) and e.rule.startswith("inplace:")]
    assert left.rule == "inplace:node-left" and left.nodes == ("n1",), left

    # the two that went on agree with each other at the end (ranks 0 and 1 of the 2-rank world)
    digests = [(out / f"digest-rank{r}.txt").read_text() for r in (0, 1)]
    assert digests[0] == digests[1], "the replicas that went on ended equal"
    assert not (out / "digest-rank2.txt").exists(), "the world ended at two ranks"


@pytest.mark.timeout(900)
def test_a_corrupting_node_whose_agent_serves_the_rendezvous_store_stays_and_the_job_finishes(tmp_path):
    """n0 serves the rendezvous store but is the group's last node (rank 2): its exit would end the
    job for all, so it is quarantined and stays; every replica rolled back, and the job finishes at 3."""
    run, out = tmp_path / "run", tmp_path / "out"
    codes, outs = _three_nodes(tmp_path, 2, {"n0": 3, "n1": 2, "n2": 1})
    assert codes == {"n0": 0, "n1": 0, "n2": 0}, (codes, outs)
    evs = events(run)
    first = next(e for e in evs if isinstance(e, SilentCorruption))
    assert first.suspect_ranks == (2,) and first.suspect_nodes == ("n0",) and first.action == "rollback", (
        first
    )
    assert HealthStore(run / "health").record("n0").state.value == "quarantined"
    decided = [e for e in evs if isinstance(e, DecisionTaken) and e.action.startswith("sdc_")]
    assert [(d.node, d.action) for d in decided] == [("n0", "sdc_quarantine"), ("n0", "sdc_stay")], decided
    assert "serves the rendezvous store, which the other nodes need" in decided[1].reason, decided[1].reason
    digests = {(out / f"digest-rank{r}.txt").read_text() for r in range(3)}
    assert len(digests) == 1, "every replica ends equal: the rollback undid the flip"
