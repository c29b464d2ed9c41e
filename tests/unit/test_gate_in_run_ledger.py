"""The agent's health gate writes each check into the run's own ledger, so the run's readers (report,
``/metrics``, dashboard) show a node that passed its gate as healthy, not as never checked."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from stalwart.events import Event
from stalwart.events.node_health import HealthChecked
from stalwart.launch.agent import NodeHealthGate
from stalwart.launch.clock import ManualClock
from stalwart.launch.ledger_sink import NodeLedger
from stalwart.policy.vocabulary import NodeState
from stalwart.serve.snapshot import take
from stalwart.settings.run_config import RunConfig

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"


class Kept:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def extend(self, evs: Iterable[Event]) -> None:
        self.events.extend(evs)

    def close(self) -> None:
        pass


def _gate(tmp_path: Path, fixture: Path) -> tuple[NodeHealthGate, Kept]:
    cfg = RunConfig(
        script=str(tmp_path / "train.py"),
        node_name="n0",
        health_fixture=fixture,
        health_state_dir=tmp_path / "health",
    )
    kept = Kept()
    ledger = NodeLedger(kept, run_id="r", node="n0")
    return NodeHealthGate(cfg, ManualClock(), tmp_path, ledger), kept


def test_a_passing_gate_is_in_the_run_ledger_and_the_node_reads_healthy(tmp_path):
    gate, kept = _gate(tmp_path, FIXTURES / "h100")
    assert gate.check(0) == ("", "")
    (checked,) = kept.events
    assert isinstance(checked, HealthChecked)
    assert (checked.node, checked.level, checked.status, checked.attempt) == ("n0", "passive", "pass", 0)
    (node,) = take(kept.events, now=checked.ts).nodes
    assert (node.node, node.state) == ("n0", NodeState.HEALTHY)


def test_a_failing_gate_is_in_the_run_ledger_too(tmp_path):
    gate, kept = _gate(tmp_path, FIXTURES / "h100_derived" / "gpu_lost")
    reason, state = gate.check(0)
    assert reason and state == "quarantined"
    (checked,) = kept.events
    assert isinstance(checked, HealthChecked) and checked.status == "fail" and checked.reason == reason
    assert checked.action == "drain_power_cycle"  # the rule table's action for a GPU off the bus
