"""A full run directory never stops the agent: events wait in memory and reach the ledger once
there is room; the console is told once each way, and a verdict that could not be written says so."""

from __future__ import annotations

from stalwart.errors import LedgerFullError
from stalwart.events import DecisionTaken, StepCompleted
from stalwart.launch.agent import Agent
from stalwart.launch.ledger_sink import NodeLedger
from stalwart.settings.run_config import RunConfig


class FlakyLedger:
    def __init__(self, fail: int) -> None:
        self.fail = fail
        self.rows: list = []

    def extend(self, evs) -> None:
        if self.fail > 0:
            self.fail -= 1
            raise LedgerFullError("cannot append to ledger x: the disk is full")
        self.rows.extend(evs)

    def close(self) -> None:
        pass


def _agent(tmp_path, notes, ledger: FlakyLedger) -> Agent:
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    cfg = RunConfig(script=str(script), run_dir=tmp_path / "run", node_name="n0", run_id="x")
    agent = Agent(cfg, note=notes.append)
    agent.ledger.close()
    agent.ledger = NodeLedger(ledger, run_id="x", node="n0", note=notes.append)
    return agent


def _ev(i: int):
    return DecisionTaken(ts=float(i), action="restart", reason=f"r{i}", run_id="x", node="n0", attempt=0)


def test_events_wait_for_room_and_arrive_in_order(tmp_path):
    notes: list[str] = []
    flaky = FlakyLedger(fail=2)
    agent = _agent(tmp_path, notes, flaky)
    for i in range(3):
        agent.ledger.emit(_ev(i), show=False)
    assert [e.reason for e in flaky.rows] == ["r0", "r1", "r2"]
    assert len(notes) == 2 and "ledger not written" in notes[0] and "writable again" in notes[1]


def test_a_verdict_that_cannot_be_written_is_said(tmp_path):
    notes: list[str] = []
    agent = _agent(tmp_path, notes, FlakyLedger(fail=10**6))
    code = agent._end("succeeded", "training finished", 0)
    assert code == 0
    assert any("missing 1 event(s), this verdict included" in n for n in notes)


def test_step_records_are_dropped_first_when_memory_bound_is_reached(tmp_path):
    notes: list[str] = []
    agent = _agent(tmp_path, notes, FlakyLedger(fail=10**6))
    steps = [
        StepCompleted(ts=float(i), rank=0, step=i, start=0.0, duration=0.1, run_id="x", node="n0", attempt=0)
        for i in range(200_001)
    ]
    agent.ledger.emit(_ev(-1), show=False)
    agent.ledger.record(steps)
    assert agent.ledger.dropped == 200_001 and [e.reason for e in agent.ledger.unwritten] == ["r-1"]
