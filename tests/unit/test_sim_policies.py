"""The simulator asks the agent's own policies: changing a policy's configuration changes the outcome."""

import numpy as np
import pytest

from stalwart.policy.restart_policy import RestartBudget
from stalwart.policy.timeouts import HangTimeoutPolicy, hang_timeout
from stalwart.policy.world_size import SizeRule
from stalwart.sim import CheckpointTier, FailureClass, SimConfig, simulate
from stalwart.sim.agent_probe import MONITOR_INTERVAL_S
from stalwart.sim.policies import WorldSizer, restart_period


def _cfg(**kw):
    values = dict(
        gpus=64,
        days=2.0,
        trials=50,
        seed=3,
        failures=[FailureClass(name="x", per_1000_gpu_days=100.0, node_loss=False, detect_s=30.0)],
        planned_per_1000_gpu_days=0.0,
        decide_s=0.0,
        tiers=[CheckpointTier(name="fs", interval_s=600.0, stall_s=5.0, restore_s=30.0)],
    )
    values.update(kw)
    return SimConfig(**values)


@pytest.mark.parametrize("budget,period", [(0, 1), (3, 4), (10, 11)])
def test_restart_period_is_where_the_shipped_policy_stops(budget, period):
    assert restart_period(RestartBudget(max_restarts=budget)) == period
    assert restart_period(None) is None


def test_a_smaller_restart_budget_sends_the_job_back_through_the_queue_more_often():
    free = simulate(_cfg(requeue_s=1800.0))
    tight = simulate(_cfg(requeue_s=1800.0, max_restarts=1))
    loose = simulate(_cfg(requeue_s=1800.0, max_restarts=5))
    assert free.buckets["queue"].sum() == 0
    # every 2nd (6th) infrastructure failure exhausts the budget; the requeue replaces that restart
    ratio_tight = tight.buckets["queue"].sum() / (1800.0 * tight.interruptions.sum())
    ratio_loose = loose.buckets["queue"].sum() / (1800.0 * loose.interruptions.sum())
    assert 0.4 < ratio_tight < 0.55 and 0.1 < ratio_loose < 0.2
    assert tight.ettr.mean() < loose.ettr.mean() < free.ettr.mean()


@pytest.mark.parametrize("step_s,multiplier", [(2.0, 3.0), (30.0, 3.0), (30.0, 5.0), (400.0, 3.0)])
def test_hangs_are_detected_after_the_shipped_hang_timeout(step_s, multiplier):
    hang = [FailureClass(name="h", per_1000_gpu_days=100.0, node_loss=False, detect_s=999.0, kind="hang")]
    r = simulate(_cfg(failures=hang, step_s=step_s, hang_multiplier=multiplier, days=20.0))
    # the agent's monitors declare a hang up to one monitor tick before the timeout (sim/agent_probe.py)
    expect = hang_timeout([step_s] * 5, HangTimeoutPolicy(multiplier=multiplier)).seconds - MONITOR_INTERVAL_S
    # every detection is that latency, except one the horizon cuts short
    per = r.buckets["detection"] / np.maximum(r.interruptions, 1)
    assert np.all(per <= expect + 1e-9)
    assert np.median(per) == pytest.approx(expect)


def test_world_size_rule_decides_how_far_an_elastic_job_shrinks():
    any_size = WorldSizer(nodes=100, spares=2, gpus_per_node=8, min_nodes=50, rule=SizeRule("multiple", 1))
    by_16 = WorldSizer(nodes=100, spares=2, gpus_per_node=8, min_nodes=50, rule=SizeRule("multiple", 80))
    assert any_size.share(2) == (True, 1.0)  # spares step in
    assert any_size.share(5) == (True, 0.97)
    assert by_16.share(5) == (True, 0.9)  # 97 nodes x 8 is not a multiple of 80; 90 x 8 is
    strict = WorldSizer(nodes=100, spares=2, gpus_per_node=8, min_nodes=100, rule=SizeRule())
    assert strict.share(3)[0] is False  # cannot shrink: wait for a repaired node


def test_changing_the_size_rule_changes_the_simulated_outcome():
    lossy = [FailureClass(name="gpu", per_1000_gpu_days=2.0, node_loss=True, detect_s=30.0)]
    base = dict(
        gpus=800,
        failures=lossy,
        spare_nodes=0,
        elastic=True,
        min_nodes_fraction=0.5,
        repair_hours=12.0,
        days=20.0,
    )
    free = simulate(_cfg(**base))
    coarse = simulate(_cfg(size_divisor=80, **base))
    assert free.buckets["shrunk"].mean() > 0
    assert coarse.buckets["shrunk"].mean() > 2 * free.buckets["shrunk"].mean()
    assert coarse.ettr.mean() < free.ettr.mean()


def _reference_queue(sizer, spares, repair_s, horizon, e, det, lost):
    """One trial, one cycle at a time, in plain Python: the repair queue the engine vectorises."""
    t, pending, waits, shares = 0.0, [], [], []
    for ei, di, li in zip(e, det, lost, strict=True):
        tf = t + ei + di
        w, share = 0.0, 1.0
        if li and ei < horizon - t:
            pending.append(tf + repair_s)
        pending = [r for r in pending if r > tf]
        if li and ei < horizon - t and len(pending) > spares:
            ok, share = sizer.share(len(pending))
            if not ok:
                w, share = sorted(pending)[len(pending) - spares - 1] - tf, 1.0
        waits.append(w)
        shares.append(share)
        t = tf + w
    return np.array(waits), np.array([1.0] + shares[:-1])


@pytest.mark.parametrize("spares", [0, 1, 3])
@pytest.mark.parametrize("elastic", [False, True])
def test_engine_repair_queue_matches_a_cycle_by_cycle_reference(elastic, spares):
    from stalwart.sim.cycles import shares as _queue
    from stalwart.sim.repair_queue import sequential_waits

    rng = np.random.default_rng(4)
    rows, cols, horizon, repair = 6, 300, 40 * 3600.0, 5 * 3600.0
    e = rng.exponential(1800.0, (rows, cols))
    cls = (rng.random((rows, cols)) < 0.3).astype(np.int16)  # class 1 (30% of cycles) loses a node
    cfg = SimConfig(
        gpus=80,
        days=horizon / 86400,
        trials=rows,
        failures=[
            FailureClass(name="a", per_1000_gpu_days=1.0, node_loss=False, detect_s=20.0),
            FailureClass(name="b", per_1000_gpu_days=1.0, node_loss=True, detect_s=50.0),
        ],
        spare_nodes=spares,
        elastic=elastic,
        min_nodes_fraction=0.3 if elastic else 1.0,
        repair_hours=repair / 3600,
        tiers=[CheckpointTier(name="fs", interval_s=600.0, stall_s=5.0)],
    )
    from stalwart.sim.engine import _model, _schedule

    m = _model(cfg, _schedule(cfg))
    det, lost = m.detect[cls], m.node_loss[cls]
    sw, ss = sequential_waits(m.sizer, m.repair_s, spares, horizon, e, det, lost)
    ss = np.ones_like(e) if ss is None else ss  # None: the job runs whole whenever it runs
    vs, must = _queue(cfg, m, e, det, cls, np.cumsum(e + det, axis=1))
    vs = np.ones_like(e) if vs is None else vs  # None: the job ran at full size in every cycle
    for r in range(rows):
        rw, rs = _reference_queue(m.sizer, spares, repair, horizon, e[r], det[r], lost[r])
        np.testing.assert_allclose(sw[r], rw, atol=1e-6)
        np.testing.assert_allclose(ss[r], rs, atol=1e-12)
        if not must[r]:  # the vectorised window agrees wherever nobody waited
            np.testing.assert_allclose(vs[r], rs, atol=1e-12)
            assert not rw.any()
    if elastic:  # shrinking instead of waiting, checked against the reference above
        assert (~must).any() and (vs[~must] < 1).any()
    else:
        assert must.any()


# --- restart back-off ------------------------------------------------------------------------------


def test_backoff_table_is_the_shipped_policys_answer_per_streak():
    from stalwart.policy.restart_policy import Failure, decide
    from stalwart.sim.policies import restart_backoff

    budget = RestartBudget(max_restarts=3, backoff_base_s=1.0, backoff_max_s=30.0)
    table = restart_backoff(budget)
    assert table is not None and table[0] == 0.0
    for s in range(1, len(table)):
        history = [Failure("hang", i, -1, 0, "x", progressed=False) for i in range(s)]
        assert table[s] == decide(history, RestartBudget(max_restarts=99)).backoff_s
    assert table[-1] == 30.0 and table[-2] == 30.0  # it stops where the cap is reached
    assert restart_backoff(None) is None
    assert restart_backoff(RestartBudget(max_restarts=3, backoff_base_s=0.0)) is None


def _streak_model(table):
    from stalwart.sim.engine import _model, _schedule

    cfg = _cfg(max_restarts=5)
    m = _model(cfg, _schedule(cfg))
    from dataclasses import replace

    return replace(m, backoff=np.array(table, dtype=float))


def test_backoff_follows_streaks_of_failures_without_progress():
    from stalwart.sim.cycles import backoff as _backoff

    m = _streak_model([0.0, 0.0, 10.0, 20.0])
    rec = np.full((1, 8), 100.0)
    # cycles 1-4 fail during their recovery (no progress); 5 progresses; 6 fails during its recovery
    e = np.array([[500.0, 50.0, 50.0, 50.0, 50.0, 500.0, 50.0, 500.0]])
    cls = np.zeros((1, 8), dtype=np.int16)
    stopped = np.zeros((1, 8), dtype=bool)
    wait = _backoff(m, e, rec, cls, stopped)
    # streaks after cycles 0..6: 0,1,2,3,4,0,1 -> waits of cycles 1..7: t[0], t[1], t[2], t[3], t[3] (capped), t[0], t[1]
    np.testing.assert_array_equal(wait[0], [0.0, 0.0, 0.0, 10.0, 20.0, 20.0, 0.0, 0.0])
    # a requeue starts a new job (cycle 3 requeued: the streak before it ends), a planned stop is no failure
    stopped[0, 3] = True
    np.testing.assert_array_equal(
        _backoff(m, e, rec, cls, stopped)[0], [0.0, 0.0, 0.0, 0.0, 0.0, 10.0, 0.0, 0.0]
    )
    cls[0, 2] = m.n_cls
    stopped[0, 3] = False
    np.testing.assert_array_equal(
        _backoff(m, e, rec, cls, stopped)[0], [0.0, 0.0, 0.0, 0.0, 0.0, 10.0, 0.0, 0.0]
    )


def test_a_backoff_that_outlasts_the_next_failure_makes_that_attempt_one_without_progress_too():
    from stalwart.sim.cycles import backoff as _backoff

    m = _streak_model([0.0, 0.0, 10.0, 20.0])
    rec = np.full((1, 5), 100.0)
    # cycle 3's failure comes 105 s in: after its recovery alone, before recovery plus the 10 s wait
    e = np.array([[500.0, 50.0, 50.0, 105.0, 500.0]])
    wait = _backoff(m, e, rec, np.zeros((1, 5), dtype=np.int16), np.zeros((1, 5), dtype=bool))
    np.testing.assert_array_equal(wait[0], [0.0, 0.0, 0.0, 10.0, 20.0])


def test_the_simulator_books_the_agents_backoff_as_restart(monkeypatch):
    import stalwart.sim.engine as engine

    # failures every ~3 minutes against 2-minute restarts: many attempts fail before they progress
    cfg = _cfg(max_restarts=1000, job_restart_s=120.0, trials=200)
    cfg = cfg.model_copy(
        update={"failures": [FailureClass(name="x", per_1000_gpu_days=1000 * 480.0 / cfg.gpus)]}
    )
    with_backoff = simulate(cfg)
    monkeypatch.setattr(engine, "restart_backoff", lambda budget: None)
    without = simulate(cfg)
    np.testing.assert_array_equal(with_backoff.interruptions, without.interruptions)  # same draws
    extra = with_backoff.buckets["restart"].mean() - without.buckets["restart"].mean()
    assert extra > 0 and with_backoff.ettr.mean() < without.ettr.mean()


@pytest.mark.parametrize("nodes,spares,min_nodes", [(4, 2, 1), (10, 3, 4), (6, 0, 2), (3, 5, 1)])
def test_more_nodes_in_repair_than_active_leave_only_the_healthy_ones_running(nodes, spares, min_nodes):
    """With more nodes in repair than active, the extras were taken off the remaining spares only: once
    those ran out the job kept running on nodes that were in repair (4 nodes + 2 spares, 5 out: half
    the job instead of a quarter)."""
    sizer = WorldSizer(
        nodes=nodes, spares=spares, gpus_per_node=8, min_nodes=min_nodes, rule=SizeRule("multiple", 1)
    )
    for out in range(nodes + spares + 2):
        healthy = max(0, nodes + spares - out)
        runnable = healthy >= min_nodes
        expect = (runnable, min(nodes, healthy) / nodes if runnable else 0.0)
        assert sizer.share(out) == pytest.approx(expect), (out, sizer.share(out), expect)


@pytest.mark.parametrize("every,step_s,expect", [(100, 2.0, 100.0), (10, 2.0, 10.0), (1000, 2.0, 300.0)])
def test_silent_corruption_is_found_half_a_replica_check_interval_after_it_strikes(every, step_s, expect):
    """N steps between checks at step_s: found on average N * step_s / 2 later, never later than half
    the checkpoint interval (600 s: a save checks too); its own detect_s (3600 s) no longer applies."""
    sdc = [
        FailureClass(name="silent_data_corruption", per_1000_gpu_days=100.0, node_loss=False, detect_s=3600.0)
    ]
    r = simulate(_cfg(failures=sdc, step_s=step_s, sdc={"every": every}, days=20.0))
    per = r.buckets["detection"] / np.maximum(r.interruptions, 1)
    assert np.all(per <= expect + 1e-9) and np.median(per) == pytest.approx(expect)


def test_silent_corruption_keeps_its_own_detection_without_a_known_check_interval():
    sdc = [
        FailureClass(name="silent_data_corruption", per_1000_gpu_days=100.0, node_loss=False, detect_s=3600.0)
    ]
    for values in ({"sdc": {"every": -1}, "step_s": 2.0}, {"sdc": {"every": 100}}, {"step_s": 2.0}):
        r = simulate(_cfg(failures=sdc, days=20.0, **values))
        per = r.buckets["detection"] / np.maximum(r.interruptions, 1)
        assert np.median(per) == pytest.approx(3600.0), values


def test_with_the_budget_the_check_interval_follows_the_checks_cost():
    """--sdc-every 0: the interval is the one the 1% budget allows a check of sdc_check_s."""
    sdc = [
        FailureClass(name="silent_data_corruption", per_1000_gpu_days=100.0, node_loss=False, detect_s=3600.0)
    ]
    r = simulate(_cfg(failures=sdc, step_s=1.0, sdc={"every": 0, "budget": 0.01}, sdc_check_s=0.5, days=20.0))
    per = r.buckets["detection"] / np.maximum(r.interruptions, 1)
    assert np.median(per) == pytest.approx(50 * 1.0 / 2)  # 0.5 s / (1% of 1 s) = every 50 steps
