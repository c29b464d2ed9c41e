"""Straggler -> action: exclude when continuing slow costs more than restarting without the node."""

from __future__ import annotations

import dataclasses

import pytest

from stalwart.diagnose.straggler_action import (
    StragglerActionConfig,
    StragglerCase,
    Workload,
    confidence_from_windows,
    decide_straggler,
)
from stalwart.errors import ConfigError
from stalwart.policy.world_size import SizeRule, plan_world

NODES = [f"n{i}" for i in range(8)]


def work(nodes=NODES, remaining_steps=20_000, step_time_s=2.0, rule=SizeRule()):
    return Workload(
        plan=plan_world(nodes, 8, 1, 8, rule),
        step_time_s=step_time_s,
        remaining_steps=remaining_steps,
        min_nodes=1,
        max_nodes=8,
        rule=rule,
    )


def test_a_costly_straggler_is_excluded_at_the_next_valid_size():
    # 8 nodes x 8 = 64 processes, power-of-two rule: without n3 the next valid size is 4 nodes (32)
    d = decide_straggler(StragglerCase("n3", 27, slowdown=3.0, confidence=0.95, since=0.0), work(), now=600.0)
    assert d.exclude and d.action == "exclude_quarantine"
    assert d.next_plan is not None and d.next_plan.world_size == 32 and "n3" not in d.next_plan.active
    # continuing: 2.0 x 40000 s x 64; excluding: 64 x (300 + 40000 x (64/32 - 1))
    assert d.continue_cost_gpu_s == pytest.approx(2.0 * 40_000 * 64)
    assert d.exclude_cost_gpu_s == pytest.approx(64 * (300 + 40_000))
    assert d.reason.startswith("exclude n3 and quarantine it: continuing slow costs")
    assert "next valid size 32 of 64 processes" in d.reason
    assert d.incident.action == "exclude_quarantine" and d.incident.blast_radius.ranks == (27,)
    assert d.incident.cost_gpu_s == pytest.approx(64 * 600 * (1 - 1 / 3.0))  # slow so far


def test_a_mild_straggler_is_kept_because_a_shrink_costs_more():
    d = decide_straggler(
        StragglerCase("n3", 27, slowdown=1.15, confidence=0.95, since=0.0), work(), now=600.0
    )
    assert d.action == "keep" and not d.exclude
    assert d.continue_cost_gpu_s < d.exclude_cost_gpu_s
    assert d.reason.startswith("keep going: continuing slow costs") and "pays off only above 1.5x" in d.reason


def test_with_a_hot_spare_even_a_mild_straggler_is_worth_excluding():
    d = decide_straggler(
        StragglerCase("n3", 27, slowdown=1.15, confidence=0.95, since=0.0),
        work(nodes=NODES + ["spare1"]),
        now=600.0,
    )
    assert d.exclude and d.next_plan.world_size == 64 and "spare1" in d.next_plan.active
    assert d.exclude_cost_gpu_s == pytest.approx(64 * 300)
    assert "hot spare keeps 64 processes" in d.reason


def test_near_the_end_of_training_keep_going():
    d = decide_straggler(
        StragglerCase("n3", 27, 1.5, 0.95, 0.0), work(nodes=NODES + ["s"], remaining_steps=100), now=10.0
    )
    assert d.action == "keep"  # 100 steps x 2 s x 0.5 x 64 < 1.5 x 300 s x 64


def test_never_acts_on_noise_or_low_confidence():
    low = decide_straggler(StragglerCase("n3", 27, 3.0, confidence=0.6, since=0.0), work(), now=1.0)
    assert low.action == "keep" and "confidence 0.60 < 0.8" in low.reason
    noise = decide_straggler(StragglerCase("n3", 27, 1.05, 1.0, 0.0), work(nodes=NODES + ["s"]), now=1.0)
    assert noise.action == "keep" and "below the noise floor 1.1x" in noise.reason
    strict = decide_straggler(
        StragglerCase("n3", 27, 3.0, 0.9, 0.0),
        work(),
        now=1.0,
        cfg=StragglerActionConfig(min_confidence=0.95),
    )
    assert strict.action == "keep"


def test_no_valid_world_without_the_node_keeps_going():
    w = Workload(
        plan=plan_world(["a", "b"], 8, 2, 2), step_time_s=1.0, remaining_steps=10**6, min_nodes=2, max_nodes=2
    )
    d = decide_straggler(StragglerCase("a", 0, 3.0, 1.0, 0.0), w, now=1.0)
    assert d.action == "keep" and d.next_plan is None and "cannot run" in d.reason


def test_a_straggler_whose_agent_serves_a_store_the_others_need_is_kept_with_that_reason():
    """Excluding it would take the store with it and end the job for every node (the rule the
    silent-data-corruption quarantine follows too): kept, whatever the costs say."""
    costly = StragglerCase("n3", 27, slowdown=3.0, confidence=0.95, since=0.0)
    host = dataclasses.replace(work(), hosts="the rendezvous store")
    d = decide_straggler(costly, host, now=600.0)
    assert d.action == "keep" and not d.exclude, d
    assert d.reason.startswith("keep going, n3 is not excluded: n3's agent serves the rendezvous store")
    assert "leaving would end the job for every node" in d.reason and " GPU-" in d.reason
    assert d.incident.action == "keep"
    # the group's first node serves the round's store
    first = decide_straggler(dataclasses.replace(costly, node="n0", rank=3), work(), now=600.0)
    assert first.action == "keep" and "serves the round's store (as the group's first node)" in first.reason
    # the same straggler on a node that serves nothing the others need is excluded
    assert decide_straggler(costly, work(), now=600.0).exclude


def test_bad_case_is_refused():
    with pytest.raises(ConfigError, match="slowdown > 0"):
        StragglerCase("n3", 1, slowdown=0.0, confidence=0.9, since=0.0)
    with pytest.raises(ConfigError):
        StragglerCase("n3", 1, slowdown=1.5, confidence=1.5, since=0.0)


def test_confidence_from_windows():
    assert confidence_from_windows(2, 5, 3) == 0.0
    assert confidence_from_windows(3, 5, 3) == pytest.approx(0.8)
    assert confidence_from_windows(5, 5, 3) == pytest.approx(1.0)


# --- the precision gate ---------------------------------------------------------------------------


def _stats(firings, confirmed):
    from stalwart.diagnose.precision import DetectorStats

    return DetectorStats("straggler", firings, confirmed, 0, 0)


def test_observe_mode_never_acts_whatever_the_precision():
    from stalwart.diagnose.straggler_action import straggler_gate

    for stats in (None, _stats(20, 20)):
        g = straggler_gate("observe", stats)
        assert g.mode == "observe" and "observe only" in g.reason


def test_auto_mode_starts_observe_only_and_acts_once_precision_is_measured_and_passes():
    from stalwart.diagnose.straggler_action import straggler_gate

    g = straggler_gate("auto", None)
    assert g.mode == "observe" and "0 firing(s) < 5" in g.reason
    g = straggler_gate("auto", _stats(4, 4))  # too few firings to know
    assert g.mode == "observe"
    g = straggler_gate("auto", _stats(10, 8), min_precision=0.9)  # measured, below the threshold
    assert g.mode == "observe" and "0.80 (8/10) < 0.9" in g.reason
    g = straggler_gate("auto", _stats(10, 9), min_precision=0.9)
    assert g.mode == "act" and "0.90 (9/10) >= 0.9" in g.reason


def test_act_mode_acts_without_data_but_measured_low_precision_overrides_it():
    from stalwart.diagnose.straggler_action import straggler_gate

    g = straggler_gate("act", None)
    assert g.mode == "act" and "not measured yet (0 firing(s)" in g.reason
    g = straggler_gate("act", _stats(3, 0))  # too few firings to count against the setting
    assert g.mode == "act"
    g = straggler_gate("act", _stats(6, 3), min_precision=0.9, min_firings=5)
    assert g.mode == "observe" and "overridden" in g.reason and "0.50 (3/6)" in g.reason
    g = straggler_gate("act", _stats(6, 6))
    assert g.mode == "act" and "1.00 (6/6)" in g.reason


def test_an_unknown_mode_is_a_config_error():
    from stalwart.diagnose.straggler_action import straggler_gate

    with pytest.raises(ConfigError, match="observe, auto, act"):
        straggler_gate("always", None)


def test_a_node_that_cannot_leave_never_acts():
    from stalwart.diagnose.straggler_action import straggler_gate

    for mode in ("auto", "act"):
        g = straggler_gate(mode, _stats(10, 10), cannot_leave="this agent hosts the rendezvous store")
        assert g.mode == "observe" and "hosts the rendezvous store" in g.reason


def test_costs_read_in_gpu_seconds_below_a_tenth_of_a_gpu_hour():
    from stalwart.diagnose.straggler_action import gpu_time

    assert gpu_time(90.4) == "90 GPU-s" and gpu_time(359) == "359 GPU-s"
    assert gpu_time(360) == "0.1 GPU-h" and gpu_time(7_200_000) == "2,000.0 GPU-h"
    assert gpu_time(float("inf")) == "unbounded"


def test_actions_and_modes_are_enums_whose_values_stay_the_ledgers_words():
    from stalwart.diagnose.precision import GateMode
    from stalwart.diagnose.straggler_action import (
        STRAGGLER_MODES,
        StragglerAction,
        StragglerMode,
        straggler_gate,
    )

    assert [a.value for a in StragglerAction] == ["keep", "exclude_quarantine"]
    assert STRAGGLER_MODES == ("observe", "auto", "act")
    assert [m.value for m in GateMode] == ["act", "observe"]
    d = decide_straggler(StragglerCase("n3", 27, slowdown=3.0, confidence=0.95, since=0.0), work(), now=600.0)
    assert d.action is StragglerAction.EXCLUDE_QUARANTINE
    # the incident carries the plain word into the ledger; f-strings and str() print the word too
    assert type(d.incident.action) is str and d.incident.action == "exclude_quarantine"
    assert f"observe_{d.action}" == "observe_exclude_quarantine" and str(GateMode.ACT) == "act"
    # the gate takes the flag's word or the enum, and answers with the enum
    assert straggler_gate(StragglerMode.ACT, None).mode is GateMode.ACT
    assert straggler_gate("observe", None).mode is GateMode.OBSERVE
    with pytest.raises(ConfigError, match="must be one of"):
        straggler_gate(None, None)  # type: ignore[arg-type]
