"""Fitting a measured run: per-node-hour rates with exact Poisson bounds, and bad ledgers refused."""

import pytest

from stalwart.errors import ConfigError, LedgerError
from stalwart.sim import CheckpointTier, FailureClass, SimConfig, simulate
from stalwart.sim.config import make_config
from stalwart.sim.fit import check_feasible, fit_run, poisson_interval, run_config
from stalwart.sim.run_ledger import events_of


def _cfg(**kw):
    values = dict(
        gpus=16,
        days=0.25,
        trials=4,
        seed=11,
        failures=[
            FailureClass(name="gpu", per_1000_gpu_days=2000.0, node_loss=True, detect_s=40.0),
            FailureClass(name="bug", per_1000_gpu_days=2000.0, node_loss=False, detect_s=15.0),
        ],
        planned_per_1000_gpu_days=0.0,
        decide_s=2.0,
        job_restart_s=90.0,
        tiers=[CheckpointTier(name="fs", interval_s=300.0, stall_s=12.0, restore_s=25.0)],
    )
    values.update(kw)
    return SimConfig(**values)


@pytest.mark.parametrize(
    "count,low,high",
    # Garwood 95% bounds for a Poisson count (published tables, e.g. Ulm 1990)
    [(0, 0.0, 3.689), (1, 0.0253, 5.572), (2, 0.2422, 7.225), (10, 4.795, 18.39), (30, 20.24, 42.83)],
)
def test_poisson_interval_matches_the_exact_tables(count, low, high):
    lo, hi = poisson_interval(count, 1.0)
    assert lo == pytest.approx(low, abs=2e-3) and hi == pytest.approx(high, rel=2e-3)
    lo2, hi2 = poisson_interval(count, 4.0)  # per unit of exposure
    assert (lo2, hi2) == pytest.approx((lo / 4, hi / 4))


def test_fit_of_a_simulated_run_recovers_its_rate_within_the_bounds():
    cfg = _cfg(days=2.0, seed=2)
    r = simulate(cfg, trace=True)
    fit = fit_run(events_of(r, step_s=5.0))
    true_per_node_hour = sum(f.per_1000_gpu_days for f in cfg.failures) / 1000 * cfg.gpus_per_node / 24
    rate, low, high = fit.per_node_hour
    assert fit.failures == int(r.interruptions[0]) >= 20
    # exposure is the whole wall time (every second is at risk, as in the simulator)
    assert fit.node_hours == pytest.approx(cfg.nodes * cfg.horizon_s / 3600)
    assert low < true_per_node_hour < high
    assert fit.stall_s == pytest.approx(12.0) and fit.interval_s == pytest.approx(300.0)
    replay = make_config(**run_config(fit, {}, trials=50))
    assert replay.gpus == cfg.gpus and replay.days == pytest.approx(cfg.days)


def test_a_run_without_steps_or_attempts_is_refused():
    with pytest.raises(LedgerError):
        fit_run([])


def test_millisecond_timestamps_are_a_units_error():
    r = simulate(_cfg(), trace=True)
    evs = [type(e)(**{**e.__dict__, "ts": e.ts * 1000.0}) for e in events_of(r, step_s=5.0)]
    with pytest.raises(LedgerError, match="milliseconds"):
        fit_run(evs)


def test_rates_that_leave_no_time_to_run_are_refused():
    fine = make_config(gpus=1024, days=1, trials=5)
    check_feasible(fine, "default")
    mad = make_config(
        gpus=16384,
        days=1,
        trials=5,
        failures=[{"name": "x", "per_1000_gpu_days": 2e5, "detect_s": 60}],
    )
    with pytest.raises(ConfigError, match="never make progress"):
        check_feasible(mad, "measured")


def test_stall_longer_than_the_interval_is_a_units_error():
    with pytest.raises(ConfigError, match="units"):
        make_config(tiers=[{"name": "a", "interval_s": 30, "stall_s": 30000}])  # ms for s
