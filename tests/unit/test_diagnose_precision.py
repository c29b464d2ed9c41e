"""Detector precision and recall from ledger events, and the observe-only gate."""

from __future__ import annotations

import pytest

from stalwart.diagnose.precision import detector_stats, firings, precision_gate, precision_table
from stalwart.events import ChaosInjected, DecisionTaken, FailureDetected, StepCompleted, StragglerDetected
from stalwart.events.integrity import SilentCorruption
from stalwart.events.node_health import HealthChecked


def crash(ts, rank, node="n1"):
    return FailureDetected(ts=ts, node=node, rank=rank, failure="crash", evidence="exit 1", onset=ts - 1)


def strag(ts, rank, node="n1"):
    return StragglerDetected(ts=ts, node=node, rank=rank, score=1.5, step=10, evidence="slow")


def step(ts):
    return StepCompleted(ts=ts, rank=0, step=int(ts), start=ts, duration=1.0)


def test_chaos_confirms_crashes_and_missed_faults_lower_recall():
    evs = [
        ChaosInjected(ts=100, node="n1", rank=1, fault="crash"),
        crash(105, 1),
        ChaosInjected(ts=500, node="n1", rank=2, fault="crash"),  # never detected
        crash(900, 3),  # no fault behind it
        ChaosInjected(ts=1000, node="n2", rank=5, fault="exit"),
        crash(1010, 5, node="n2"),
    ]
    by = {s.detector: s for s in detector_stats(evs)}
    c = by["crash"]
    assert (c.firings, c.confirmed, c.faults, c.caught) == (3, 2, 3, 2)
    assert c.precision == pytest.approx(2 / 3) and c.recall == pytest.approx(2 / 3)


def test_detection_on_another_rank_or_long_after_is_not_a_confirmation():
    evs = [
        ChaosInjected(ts=100, node="n1", rank=1, fault="crash"),
        crash(105, 2),
        ChaosInjected(ts=1000, node="n1", rank=4, fault="crash"),
        crash(2000, 4),
    ]
    c = {s.detector: s for s in detector_stats(evs)}["crash"]
    assert (c.confirmed, c.caught) == (0, 0)


def test_health_finding_and_fixing_exclusion_confirm_a_straggler():
    health = HealthChecked(
        ts=220, node="n2", level="passive", status="fail", action="drain", reason="hw thermal"
    )
    evs = [
        strag(200, 9, node="n2"),
        health,
        strag(400, 3, node="n1"),
        DecisionTaken(ts=410, node="n1", action="exclude_node", reason="slow"),
        step(420),
        step(500),
        strag(1000, 6, node="n3"),
    ]  # nothing followed: a false positive
    s = {x.detector: x for x in detector_stats(evs)}
    assert (s["straggler"].firings, s["straggler"].confirmed) == (3, 2)
    assert s["health.passive"].firings == 1 and s["health.passive"].confirmed == 0


def test_exclusion_that_did_not_fix_it_is_no_confirmation():
    evs = [
        strag(400, 3, node="n1"),
        DecisionTaken(ts=410, node="n1", action="exclude_node", reason="slow"),
        step(420),
        strag(450, 3, node="n1"),
    ]
    s = {x.detector: x for x in detector_stats(evs)}["straggler"]
    assert s.confirmed == 0


def test_slow_chaos_gives_straggler_recall():
    evs = [
        ChaosInjected(ts=10, node="n1", rank=2, fault="slow"),
        strag(40, 2),
        ChaosInjected(ts=600, node="n1", rank=3, fault="slow"),
    ]
    s = {x.detector: x for x in detector_stats(evs)}["straggler"]
    assert (s.faults, s.caught, s.recall) == (2, 1, 0.5)


def test_gate_observes_until_precise_enough():
    evs = []
    for i in range(6):
        evs += [ChaosInjected(ts=i * 1000, node="n1", rank=i, fault="crash"), crash(i * 1000 + 5, i)]
    good = {x.detector: x for x in detector_stats(evs)}["crash"]
    assert precision_gate(good).mode == "act"
    few = {x.detector: x for x in detector_stats(evs[:4])}["crash"]
    assert precision_gate(few).mode == "observe" and "2 firing(s) < 5" in precision_gate(few).reason
    noisy = {x.detector: x for x in detector_stats(evs + [crash(90_000 + i, 1) for i in range(4)])}["crash"]
    g = precision_gate(noisy)
    assert g.mode == "observe" and "precision 0.60 (6/10) < 0.9" in g.reason


def test_table_lists_every_detector_with_its_mode():
    evs = [ChaosInjected(ts=100, node="n1", rank=1, fault="crash"), crash(105, 1), strag(300, 2)]
    lines = precision_table(detector_stats(evs))
    assert lines[0].startswith("| detector | firings")
    rows = {ln.split(" | ")[0].strip("| "): ln for ln in lines[2:]}
    assert rows["crash"] == "| crash | 1 | 1 | 100% | 1 | 1 | 100% | observe |"
    assert rows["straggler"] == "| straggler | 1 | 0 | 0% | 0 | 0 | n/a | observe |"
    assert "hang" not in rows  # neither fired nor had a fault to catch: nothing to say
    assert firings(evs)[0].detector == "crash"


def test_an_incident_that_found_node_evidence_confirms_the_firing_it_explains():
    from stalwart.events import IncidentRaised

    def incident(rule, ranks=(1,), node="n1"):
        return IncidentRaised(
            ts=12.0,
            onset=9.0,
            run_id="r",
            node=node,
            attempt=0,
            cause="x",
            fault_class="hardware",
            component="gpu",
            confidence=0.95,
            action="drain_power_cycle",
            rule=rule,
            nodes=(node,),
            ranks=ranks,
        )

    base = [crash(10.0, 1), crash(11.0, 0)]
    [s] = [
        s for s in detector_stats([*base, incident("cross_layer:gpu-fell-off-bus")]) if s.detector == "crash"
    ]
    assert (s.firings, s.confirmed) == (2, 1)  # rank 1 is explained, rank 0 is not
    [s] = [s for s in detector_stats([*base, incident("cross_layer:no-cause")]) if s.detector == "crash"]
    assert s.confirmed == 0  # "no node-level cause" confirms nothing
    [s] = [
        s
        for s in detector_stats([*base, incident("cross_layer:ib-link", node="n2")])
        if s.detector == "crash"
    ]
    assert s.confirmed == 0  # another node's cause


def test_a_replay_fires_only_when_it_names_a_replica():
    def sdc(ts, verdict, ranks=(), nodes=(), replay=""):
        return SilentCorruption(
            ts=ts,
            node="n0",
            rank=0,
            step=31,
            verdict=verdict,
            suspect_ranks=ranks,
            suspect_nodes=nodes,
            replay=replay,
        )

    evs = [
        ChaosInjected(ts=100, node="n0", rank=1, fault="bitflip"),
        sdc(101, "pair"),  # names nobody: a firing at its writer's node
        sdc(102, "replayed", (1,), ("n0",), "transient"),  # names rank 1: a firing there
        sdc(103, "replayed", replay="not_reached"),  # names nobody: the pair already fired
    ]
    assert [(f.ts, f.rank) for f in firings(evs)] == [(101, -1), (102, 1)]
    s = {d.detector: d for d in detector_stats(evs)}["sdc"]
    assert (s.firings, s.confirmed, s.faults, s.caught) == (2, 2, 1, 1)


def test_a_checkpoint_found_damaged_in_the_background_is_a_caught_corruption():
    """The damaged version was set aside before any load read it: no CheckpointRejected, yet the
    corruption was caught (the demo's table said recall 0%)."""
    from stalwart.events.checkpoint import CheckpointDamaged

    evs = [
        ChaosInjected(ts=100, node="n1", fault="corrupt-checkpoint", detail="local tier: flipped 16 bytes"),
        CheckpointDamaged(ts=101.5, node="n1", step=140, tier="local", path="p", reason="checksum"),
        CheckpointDamaged(ts=101.7, node="n1", step=140, tier="memory", path="q", reason="checksum"),
    ]
    v = {s.detector: s for s in detector_stats(evs)}["checkpoint_verify"]
    assert (v.firings, v.confirmed, v.faults, v.caught) == (2, 2, 1, 1) and v.recall == 1.0
    assert [f.detector for f in firings(evs)] == ["checkpoint_verify", "checkpoint_verify"]
