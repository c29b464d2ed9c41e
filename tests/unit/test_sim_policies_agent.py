"""The simulator's answers come from the agent's supervisor and monitors on a manual clock, and agree
with the shipped pure policies they apply (sim/agent_probe.py)."""

import dataclasses

import numpy as np
import pytest

import stalwart.sim.engine as engine
from stalwart.exit_codes import EXIT_INFRA
from stalwart.policy.restart_policy import Failure, RestartBudget, decide
from stalwart.policy.timeouts import HangTimeoutPolicy, hang_timeout
from stalwart.policy.world_size import SizeRule
from stalwart.sim import FailureClass, SimConfig, simulate
from stalwart.sim.agent_probe import (
    MONITOR_INTERVAL_S,
    SUPERVISED_ATTEMPTS,
    hang_latency,
    restart_stop,
    supervised_crash,
    world_after_loss,
)
from stalwart.sim.policies import WorldSizer


def direct_period(budget: RestartBudget | None) -> int | None:
    """The old adapter's answer: the pure restart policy fed synthetic crash records."""
    if budget is None:
        return None
    history = []
    for k in range(1, 10_000):
        history.append(Failure(kind="crash", attempt=k - 1, step=k, rank=0, evidence="sim", progressed=True))
        if decide(history, budget).action == "stop":
            return k
    return None


def direct_hang_s(step_s: float, policy: HangTimeoutPolicy) -> float:
    """The old adapter's answer: the pure hang-timeout policy over calibrated step times."""
    return hang_timeout([step_s] * max(policy.min_samples, 1), policy).seconds


@pytest.mark.parametrize(
    "step_s,policy",
    [
        (0.2, HangTimeoutPolicy()),  # floor
        (30.0, HangTimeoutPolicy()),  # 3 x p99
        (30.0, HangTimeoutPolicy(multiplier=5.0, min_samples=3)),
        (400.0, HangTimeoutPolicy()),  # cap
        (50.0, HangTimeoutPolicy(floor_s=1.0, cap_s=7200.0, min_samples=12)),
    ],
)
def test_hang_latency_from_the_supervisor_is_the_shipped_timeout_less_one_tick(step_s, policy):
    probe = hang_latency(step_s, policy)
    timeout = direct_hang_s(step_s, policy)
    # the hang monitor declares up to one tick early, never late: exactly one tick with a silent rank
    assert probe.latency_s == pytest.approx(timeout - MONITOR_INTERVAL_S, abs=1e-6)
    assert timeout - MONITOR_INTERVAL_S - 1e-6 <= probe.latency_s <= timeout
    # the supervisor's own loop, run up to it, applied the hang within its minimum sleep (1 ms)
    assert 0.0 <= probe.applied_at - (probe.last_progress + probe.latency_s) <= 1e-3 + 1e-6
    assert "rank 1 silent" in probe.reason and f"{timeout:.3f}" in probe.reason


def test_the_latency_follows_the_monitor_interval_so_it_comes_from_the_decision_path():
    policy = HangTimeoutPolicy()
    fine = hang_latency(30.0, policy, 0.01).latency_s
    coarse = hang_latency(30.0, policy, 2.0).latency_s
    assert fine == pytest.approx(90.0 - 0.01, abs=1e-6)
    assert coarse == pytest.approx(90.0 - 2.0, abs=1e-6)


def test_a_supervised_kill_is_an_infrastructure_crash_of_a_rank_that_progressed():
    f = supervised_crash(attempt=2)
    assert (f.kind, f.rank, f.attempt, f.progressed, f.sdk) == ("crash", 0, 2, True, True)
    assert "SIGKILL" in f.evidence


@pytest.mark.parametrize("max_restarts", [0, 1, 3, 10, SUPERVISED_ATTEMPTS - 1, SUPERVISED_ATTEMPTS, 45, 700])
def test_restart_period_from_supervised_failures_equals_the_direct_answer(max_restarts):
    budget = RestartBudget(max_restarts=max_restarts)
    probe = restart_stop(budget)
    assert probe.period == direct_period(budget) == max_restarts + 1
    assert probe.supervised == min(max_restarts + 1, SUPERVISED_ATTEMPTS)
    assert probe.decision is not None and probe.decision.outcome == "infra_exhausted"
    assert f"restart budget used up ({max_restarts} of {max_restarts})" in probe.decision.reason


def test_no_budget_never_stops():
    assert restart_stop(None).period is None


def test_the_answers_are_cached_per_distinct_situation():
    policy = HangTimeoutPolicy(multiplier=4.0)
    assert hang_latency(12.0, policy) is hang_latency(12.0, policy)
    assert restart_stop(RestartBudget(max_restarts=2)) is restart_stop(RestartBudget(max_restarts=2))


def _direct(monkeypatch):
    monkeypatch.setattr(engine, "hang_detect_s", direct_hang_s)
    monkeypatch.setattr(engine, "restart_period", direct_period)


def _small(**kw):
    return SimConfig(gpus=2048, days=10.0, trials=40, seed=11, **kw)


def _same(a, b) -> bool:
    return all(np.array_equal(a.buckets[k], b.buckets[k]) for k in a.buckets) and np.array_equal(
        a.ettr, b.ettr
    )


def test_with_a_budget_and_no_hangs_the_agent_path_simulates_exactly_the_direct_answer(monkeypatch):
    # only the restart period comes from the agent here (no step time: no hang detection asked); the
    # budget is small enough that jobs do reach it in 10 days, which a period one off would change
    cfg = _small(max_restarts=3)
    new = simulate(cfg)
    _direct(monkeypatch)
    assert engine._model(cfg, engine._schedule(cfg)).period == 4
    old = simulate(cfg)
    assert _same(new, old)
    monkeypatch.setattr(engine, "restart_period", lambda budget: 5)
    assert not _same(new, simulate(cfg))  # the comparison above can tell a period one off


def test_with_a_budget_and_hangs_only_hang_detection_moves_by_one_tick(monkeypatch):
    hangs = [FailureClass(name="h", per_1000_gpu_days=5.0, node_loss=False, detect_s=999.0, kind="hang")]
    crashes = [FailureClass(name="c", per_1000_gpu_days=5.0, node_loss=False, detect_s=20.0)]
    cfg = _small(failures=hangs + crashes, step_s=8.0, max_restarts=3)
    new_model = engine._model(cfg, engine._schedule(cfg))
    new = simulate(cfg)
    _direct(monkeypatch)
    old_model = engine._model(cfg, engine._schedule(cfg))
    old = simulate(cfg)
    assert new_model.period == old_model.period == 4
    np.testing.assert_allclose(new_model.detect, old_model.detect - [MONITOR_INTERVAL_S, 0.0, 0.0], atol=1e-6)
    # the same failures and requeues, except that a trial's shorter detections can fit one more
    # failure (and its requeue) before the horizon, or move a requeue the horizon cuts short by the
    # time they saved; detection is one tick shorter per hang (or, when the horizon falls in the
    # last detection, that one absorbs the time saved and the total stays the same)
    extra = new.interruptions - old.interruptions
    assert set(np.unique(extra)) <= {0, 1} and (extra == 0).mean() > 0.5
    saved = MONITOR_INTERVAL_S * new.interruptions
    assert np.all(np.abs(new.buckets["queue"] - old.buckets["queue"]) <= cfg.requeue_s * extra + saved + 1e-6)
    same = extra == 0
    shift = (old.buckets["detection"] - new.buckets["detection"])[same]
    assert (
        np.all(shift >= -1e-6)
        and (shift > 1.0).mean() > 0.5
        and np.all(shift <= MONITOR_INTERVAL_S * new.interruptions[same] + 1e-6)
    )
    np.testing.assert_allclose(new.ettr, old.ettr, rtol=1e-4)


def test_a_probe_that_cannot_stop_reports_no_period():
    # a budget larger than the probe looks for: no stop found, the same as no budget
    huge = dataclasses.replace(RestartBudget(), max_restarts=10**9)
    assert restart_stop(huge, supervised=2).period is None


def test_a_hang_floor_the_agent_would_refuse_is_one_clear_error():
    from stalwart.errors import ConfigError

    with pytest.raises(ConfigError, match="hang floor 0.04s is not above the agent's monitor interval"):
        simulate(_small(step_s=0.001, hang_floor_s=0.04))
    assert simulate(_small(step_s=0.001, hang_floor_s=0.06)).ettr.mean() > 0  # above the tick: fine


@pytest.mark.parametrize(
    "nodes,spares,min_nodes,rule",
    [
        (8, 2, 1, SizeRule()),
        (8, 2, 8, SizeRule()),
        (6, 1, 1, SizeRule()),
        (6, 3, 2, SizeRule("multiple", 3)),
    ],
)
def test_the_job_policy_world_after_a_loss_agrees_with_the_simulators_sizer(nodes, spares, min_nodes, rule):
    sizer = WorldSizer(nodes, spares, 4, min_nodes, rule)
    active = round(sizer.initial_share * nodes)
    # up to every active node lost (the sizer takes more than that off its spares only, not off the
    # spares that stepped in: there the two differ, and the job policy counts every node lost)
    for lost in range(active + 1):
        probe = world_after_loss(nodes, spares, 4, min_nodes, rule, lost)
        runnable, share = sizer.share(lost)
        assert probe.runnable == runnable, (lost, probe.reason)
        assert probe.active / nodes == pytest.approx(share if runnable else 0.0), (lost, probe.reason)


def test_the_job_policy_replaces_lost_nodes_by_spares_then_shrinks():
    rule = SizeRule()
    kinds = [world_after_loss(8, 2, 4, 1, rule, lost).decision for lost in range(4)]
    assert kinds == ["restart", "replace", "replace", "shrink"]
    assert world_after_loss(8, 2, 4, 8, rule, 3).decision == "end"  # not elastic: no smaller world
    assert world_after_loss(8, 2, 4, 1, rule, 9).active == 1  # one node of the pool left
    assert world_after_loss(8, 2, 4, 1, rule, 10).runnable is False  # nothing left


def test_the_restart_probe_runs_the_job_runner_to_the_policys_end():
    probe = restart_stop(RestartBudget(max_restarts=2))
    assert probe.period == probe.supervised == 3
    assert probe.decision is not None and probe.decision.exit_code == EXIT_INFRA
    assert probe.decision.records[0].action == "stop"
