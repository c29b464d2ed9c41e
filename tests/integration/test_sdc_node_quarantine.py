"""Silent data corruption, agent side, over real files: a finding a worker sends over its real pipe
(as the cross-replica check does) reaches the agent's handler, which quarantines the node it names
through the real node controller into a real node-state directory and writes the run's real ledger;
the health gate then keeps the node out of the next start, and `stalwart nodes` (a real process)
lists it with the reason (named by majority, or by the replay of a pair's step). Findings that cannot
tell which replica is corrupted touch nothing. With
a real Slurm cluster the node is drained with Stalwart's owned reason, and an operator's drain is
left alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_cluster import slurm_factory  # noqa: F401  (fixture)
from stalwart.chaos.plan import FaultPlan
from stalwart.events import DecisionTaken
from stalwart.health.node_store import HealthStore
from stalwart.launch.agent import NodeHealthGate
from stalwart.launch.agent_chaos import AgentChaos
from stalwart.launch.attempt.node_workers import NodeWorkers
from stalwart.launch.attempt.sdc_quarantine import SdcQuarantine
from stalwart.launch.clock import ManualClock
from stalwart.launch.fakes import FakeGroup, RecordingConsole
from stalwart.launch.ledger_sink import NodeLedger
from stalwart.ledger import LedgerWriter, read_available
from stalwart.ledger.store import ledger_files
from stalwart.policy.job import AttemptStatus
from stalwart.policy.world_size import SizeRule, WorldPlan
from stalwart.protocol import CorruptionFound
from stalwart.protocol.pipe import Receiver, Sender
from stalwart.protocol.run_dir import RunDir
from stalwart.settings.run_config import RunConfig

pytestmark = pytest.mark.integration

GOOD = Path(__file__).resolve().parent.parent / "fixtures" / "gpu" / "h100"  # passes every check


class Agent:
    """The agent's parts the finding goes through: the pipe, the job link, the ledger, the handler."""

    def __init__(
        self, tmp_path: Path, node: str, backend: str = "local", world: WorldPlan | None = None
    ) -> None:
        self.node = node
        self.run = RunDir(tmp_path / "run").create()
        self.state = tmp_path / "health"
        self.cfg = RunConfig(
            script=str(tmp_path / "train.py"),
            node_name=node,
            health_fixture=GOOD,
            health_state_dir=self.state,
            health_backend=backend,
        )
        self.clock = ManualClock()
        self.writer = LedgerWriter(self.run.agent_ledger(node, os.getpid()), writer="agent")
        self.ledger = NodeLedger(self.writer, run_id="r", node=node)
        self.console = RecordingConsole()
        job = NodeWorkers(
            self.cfg,
            run=self.run,
            clock=self.clock,
            ledger=self.ledger,
            console=self.console,
            faults=FaultPlan(),
            chaos=AgentChaos(FaultPlan(), self.run, self.ledger, self.clock),
        )
        self.group = FakeGroup.of(range(3))
        sizes = (2, 3, SizeRule("multiple"))  # the job runs on 2 or 3 nodes
        self.sdc = SdcQuarantine(node, job, self.ledger, self.console, self.clock, self.group, world, sizes)
        self.receiver = Receiver()
        self.workers = [Sender(self.receiver.new_channel()) for _ in range(3)]

    def report(
        self, verdict: str, suspects: tuple[int, ...], nodes: tuple[str, ...], confidence: float
    ) -> None:
        """Every rank tells its agent (ReplicaCheck's ``tell``), and the agent drains its pipes."""
        for rank, w in enumerate(self.workers):
            w.send(CorruptionFound(rank, 41, verdict, suspects, nodes, confidence, 1.0, ("model.0.weight",)))
        for msg in self.receiver.drain():
            assert isinstance(msg, CorruptionFound)
            self.sdc.seen(msg)

    def close(self) -> None:
        for w in self.workers:
            w.close()
        self.receiver.close()
        self.writer.close()

    def decisions(self) -> list[DecisionTaken]:
        evs = read_available(ledger_files(self.run.root), require_some=False).events
        return [e for e in evs if isinstance(e, DecisionTaken)]


def nodes_listing(state: Path, *extra: str, env: dict[str, str] | None = None) -> dict[str, dict]:
    p = subprocess.run(
        [sys.executable, "-m", "stalwart.cli", "nodes", "--state-dir", str(state), "--json", *extra],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert p.returncode == 0, p.stderr
    return {r["node"]: r for r in json.loads(p.stdout)}


@pytest.mark.parametrize("verdict", ["odd_one_out", "replayed"])
def test_the_named_node_is_quarantined_the_gate_keeps_it_out_and_stalwart_nodes_shows_why(tmp_path, verdict):
    agent = Agent(tmp_path, "gpu-a")
    try:
        if verdict == "replayed":  # a pair's finding names nobody; the replay of its step names rank 1
            agent.report("pair", (), (), 0.5)
        agent.report(verdict, (1,), ("gpu-a",), 0.9)
    finally:
        agent.close()
    rec = HealthStore(agent.state).record("gpu-a")
    assert rec.state.value == "quarantined" and rec.fault_key == "sdc" and rec.needs_human
    for part in (
        "sdc: silent data corruption after step 41",
        "rank 1 on gpu-a",
        verdict,
        "model.0.weight",
    ):
        assert part in rec.reason, rec.reason
    # one quarantine, though three ranks reported the finding; the job's only node stays in it
    dt, stay = agent.decisions()
    assert dt.action == "sdc_quarantine" and dt.node == "gpu-a" and "node state: quarantined" in dt.reason
    assert stay.action == "sdc_stay" and "no valid world size is left" in stay.reason

    # the next start: the node's own checks pass, yet the gate keeps it out (no check clears silent corruption)
    reason, state = NodeHealthGate(agent.cfg, ManualClock(2_000_000.0), agent.run.root).check(1)
    assert state == "quarantined" and "an operator must repair and resume the node" in reason
    row = nodes_listing(agent.state)["gpu-a"]
    assert row["state"] == "quarantined" and row["needs_human"] and "after step 41" in row["reason"]


def test_a_quarantined_node_of_a_job_that_goes_on_without_it_leaves_the_running_attempt(tmp_path):
    """Three nodes, two make a valid size: the named node's agent stops its workers at once (no save:
    the replicas rolled back already) and ends the attempt excluded; the job's only node stays."""
    agent = Agent(tmp_path / "three", "gpu-b", world=WorldPlan(("gpu-a", "gpu-b", "gpu-c"), (), 3, "planned"))
    alone = Agent(tmp_path / "alone", "gpu-b")
    try:
        assert agent.sdc.leave() is None, "nothing found yet: nobody leaves"
        agent.report("odd_one_out", (4,), ("gpu-b",), 0.9)
        alone.report("odd_one_out", (1,), ("gpu-b",), 0.9)
        # a stop (an emergency save) or a re-formation its ranks take part in comes first
        assert agent.sdc.leave(busy=True) is None and agent.group.stops == []
        out = agent.sdc.leave()
        assert out is not None and out.status is AttemptStatus.EXCLUDED, out
        assert agent.group.stops == [0.0] and all(c is not None for c in agent.group.poll().values())
        assert "corrupting a replica silently" in out.detail and "goes on at 2 node(s)" in out.detail
        assert alone.sdc.leave() is None and alone.group.stops == []
        assert any("stays in the running job" in n and "0 other node(s)" in n for n in alone.console.notes)
    finally:
        agent.close()
        alone.close()
    assert [d.action for d in agent.decisions()] == ["sdc_quarantine", "sdc_exclude"]
    assert [d.action for d in alone.decisions()] == ["sdc_quarantine", "sdc_stay"]


@pytest.mark.parametrize(
    "verdict,suspects,nodes,confidence",
    [
        ("pair", (), (), 0.5),
        ("split", (), (), 0.0),
        ("odd_one_out", (1,), ("gpu-b",), 0.9),
        ("replayed", (), (), 0.0),
    ],
    ids=["pair", "split", "another-node", "replay-names-nobody"],
)
def test_a_finding_that_does_not_name_this_node_with_confidence_touches_nothing(
    tmp_path, verdict, suspects, nodes, confidence
):
    agent = Agent(tmp_path, "gpu-a")
    try:
        agent.report(verdict, suspects, nodes, confidence)
    finally:
        agent.close()
    assert HealthStore(agent.state).events() == [] and agent.decisions() == []
    assert NodeHealthGate(agent.cfg, ManualClock(), agent.run.root).check(1) == ("", "")


@pytest.mark.slurm
def test_slurm_drains_the_named_node_with_stalwarts_reason_and_leaves_an_operators_drain_alone(
    slurm_factory,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    c = slurm_factory()
    monkeypatch.setenv("SLURM_CONF", str(c.conf))
    agent = Agent(tmp_path / "a", "node2", backend="slurm")
    try:
        agent.report("odd_one_out", (1,), ("node2",), 0.9)
    finally:
        agent.close()
    st, reason = c.nodes()["node2"]
    assert "drain" in st and reason.startswith("stalwart: sdc: silent data corruption after step 41"), reason
    assert any("node state: quarantined (drain: slurm)" in n for n in agent.console.notes), (
        agent.console.notes
    )

    c.run("scontrol", "update", "NodeName=node3", "State=DRAIN", "Reason=maintenance: PSU swap")
    other = Agent(tmp_path / "b", "node3", backend="slurm")
    try:
        other.report("odd_one_out", (1,), ("node3",), 0.9)
    finally:
        other.close()
    assert c.nodes()["node3"][1] == "maintenance: PSU swap", "an operator's drain is never overwritten"
    rows = nodes_listing(agent.state, "--backend", "slurm", env=dict(os.environ))
    assert rows["node2"]["drained_by"] == "stalwart" and rows["node2"]["state"] == "quarantined"
    assert rows["node3"]["drained_by"] == "operator"
