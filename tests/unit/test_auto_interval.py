"""--checkpoint-every auto: Daly on measured stall and MTBF, floored by the persist; one decision
function for a live run and for `plan --ledger`."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from stalwart.account.ettr import daly_interval
from stalwart.checkpoint.advisor import (
    DEFAULT_MTBF_S,
    AutoInputs,
    decide_interval,
    inputs_from_events,
    mtbf_of_run,
    recommend_from_ledger,
)
from stalwart.checkpoint.auto_every import FIRST_SAVE_STEPS, AutoEvery
from stalwart.events import CheckpointCommitted, CheckpointStaged, FailureDetected, StepCompleted
from stalwart.events.checkpoint import CheckpointIntervalAdvised


def test_the_interval_is_daly_from_account_ettr_in_whole_steps():
    x = AutoInputs(step_s=0.5, stall_s=2.0, persist_s=0.0, mtbf_s=3600.0, mtbf_source="t")
    c = decide_interval(x)
    assert c.daly_s == daly_interval(2.0, 3600.0)
    assert c.steps == round(daly_interval(2.0, 3600.0) / 0.5) and "Daly" in c.reason


def test_frequent_failures_shorten_the_interval():
    calm = decide_interval(AutoInputs(0.1, 0.05, 0.2, DEFAULT_MTBF_S, "default"))
    stormy = decide_interval(AutoInputs(0.1, 0.05, 0.2, 20.0, "this run"))
    assert stormy.steps < calm.steps


def test_a_persist_always_finishes_before_the_next_save():
    # failures every 5 s and a cheap stall want a save every step; the persist takes 1.5 s
    c = decide_interval(AutoInputs(step_s=0.1, stall_s=0.01, persist_s=1.5, mtbf_s=5.0, mtbf_source="t"))
    assert c.steps * 0.1 >= 1.5 and c.steps == math.ceil(1.5 * 1.2 / 0.1)
    assert "persist floor" in c.reason


def test_the_mtbf_is_the_runs_own_else_history_else_the_default():
    assert mtbf_of_run(3, 300.0)[0] == 100.0
    assert mtbf_of_run(0, 300.0, history_mtbf_s=7200.0) == (7200.0, "node history")
    assert mtbf_of_run(0, 300.0)[0] == DEFAULT_MTBF_S


def _ledger(failures: int) -> list:
    evs: list = []
    for s in range(40):
        evs += [StepCompleted(ts=100 + s, rank=r, step=s, start=99.5 + s, duration=0.5) for r in (0, 1)]
    for s in (10, 20, 30):
        evs.append(CheckpointStaged(ts=100 + s, rank=0, step=s, stall_s=0.08))
        evs.append(CheckpointCommitted(ts=100.9 + s, rank=0, step=s, path="p", stall_s=0.08))
    evs += [
        FailureDetected(ts=120.0 + i, rank=1, failure="crash", evidence="x", onset=119.0 + i)
        for i in range(failures)
    ]
    return evs


def test_plan_recommends_what_the_same_inputs_decide():
    evs = _ledger(failures=2)
    x = inputs_from_events(evs)
    assert x is not None
    assert (x.step_s, x.stall_s, x.mtbf_s) == (0.5, 0.08, 10.0)  # 20 s trained, 2 failures
    assert x.persist_s == pytest.approx(0.9)
    assert recommend_from_ledger(evs) == decide_interval(x)
    assert recommend_from_ledger(_ledger(0)).steps > recommend_from_ledger(evs).steps


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_live_run_saves_first_to_measure_then_at_the_decided_interval_and_records_each_change():
    clock, events = _Clock(), []
    stalls = {"stall": 0.02, "persist": 0.9}
    auto = AutoEvery(
        stall=lambda: stalls["stall"],
        persist=lambda: stalls["persist"],
        now=clock,
        failures=4,
        training_s=36.0,  # the ledger said: 4 failures in 36 s of training before this attempt
        emit=events.append,
        agree=lambda v: v,
    )
    saves = []
    for completed in range(1, 61):
        clock.t += 0.1
        if auto.due(completed):
            saves.append(completed)
            auto.saved(completed)
    assert saves[0] == FIRST_SAVE_STEPS
    choice = auto.choices[0]
    assert choice.steps == auto.steps and choice.steps * 0.1 >= 0.9 * 1.2
    assert all(b - a == choice.steps for a, b in zip(saves[1:], saves[2:], strict=False))
    assert [type(e) for e in events] == [CheckpointIntervalAdvised]  # one decision, kept after
    assert events[0].interval_steps == choice.steps and events[0].applied and "MTBF" in events[0].reason


def test_the_node_history_reaches_a_run_that_has_not_failed_yet(tmp_path):
    """The agent reads the node's quarantines from its health store (HealthStore.failure_mtbf) and the
    session's auto interval decides on that MTBF instead of the stated default."""
    from stalwart.checkpoint.auto_every import auto_every_for
    from stalwart.events.node_health import NodeStateChanged
    from stalwart.health.node_store import HealthStore

    def changed(ts: float, to: str, node: str = "n0") -> NodeStateChanged:
        return NodeStateChanged(
            ts=ts, node=node, from_state="healthy", to_state=to, action="none", reason="r"
        )

    history = [changed(0.0, "suspect"), changed(1800.0, "quarantined"), changed(2000.0, "healthy")]
    history += [changed(5000.0, "quarantined"), changed(10.0, "quarantined", node="n1")]
    store = HealthStore(tmp_path / "health")
    assert store.failure_mtbf("n0", 7200.0, history) == 3600.0  # 2 quarantines over 2 hours
    assert store.failure_mtbf("n2", 7200.0, history) is None  # no record: no history
    assert store.failure_mtbf("n0", 7200.0, [changed(0.0, "suspect")]) is None  # never failed: no rate

    clock = iter(float(t) for t in range(100))
    auto = auto_every_for(
        SimpleNamespace(last_stall_s=0.1, last_persist_s={"local": 0.2}),
        None,
        lambda: next(clock),
        None,
        dict,
        history_mtbf_s=3600.0,
    )
    auto.due(1)
    auto.due(2)
    choice = auto.saved(2)
    assert choice is not None and "node history" in choice.reason
