"""A simulated run written as a ledger reads back through the report with the simulator's buckets."""

import numpy as np
import pytest

from stalwart.account.goodput import BUCKETS as REPORT_BUCKETS
from stalwart.account.goodput import compute
from stalwart.errors import ConfigError
from stalwart.ledger import read_merged
from stalwart.sim import CheckpointTier, FailureClass, SimConfig, simulate
from stalwart.sim.buckets import SIM_BUCKETS, to_report
from stalwart.sim.run_ledger import events_of, write


def _cfg(**kw):
    values = dict(
        gpus=16,
        days=0.25,  # 6 hours
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


def test_sim_buckets_are_the_report_buckets_plus_what_only_a_simulation_sees():
    assert set(REPORT_BUCKETS) <= set(SIM_BUCKETS)
    folded = to_report({"wait_nodes": 5.0, "restart": 1.0, "shrunk": 2.0, "productive": 3.0})
    assert folded["restart"] == 6.0 and folded["productive"] == 5.0
    assert set(folded) == set(REPORT_BUCKETS)


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_report_of_a_simulated_ledger_equals_the_simulation(tmp_path, seed):
    r = simulate(_cfg(seed=seed), trace=True)
    assert sum(1 for c in r.trace if c["failed"]) >= 5  # enough faults to exercise every bucket
    write(r, tmp_path, step_s=5.0)
    report = compute(read_merged(tmp_path))
    sim = to_report({b: float(v[0]) for b, v in r.buckets.items()})
    assert report.wall_s == pytest.approx(r.config.horizon_s, abs=1e-3)
    for name in REPORT_BUCKETS:
        assert report.buckets[name] == pytest.approx(sim[name], abs=1e-3), name
    assert len(report.interruptions) == int(r.interruptions[0])


def test_waiting_for_a_repaired_node_is_restart_time_in_the_report(tmp_path):
    r = simulate(_cfg(spare_nodes=0, repair_hours=0.2, seed=5), trace=True)
    assert r.buckets["wait_nodes"][0] > 0
    write(r, tmp_path, step_s=5.0)
    report = compute(read_merged(tmp_path))
    sim = to_report({b: float(v[0]) for b, v in r.buckets.items()})
    np.testing.assert_allclose(
        [report.buckets[b] for b in REPORT_BUCKETS], [sim[b] for b in REPORT_BUCKETS], atol=1e-3
    )


def test_ledger_needs_a_step_that_divides_the_interval():
    r = simulate(_cfg(), trace=True)
    with pytest.raises(ConfigError, match="divide"):
        events_of(r, step_s=7.0)


def test_failures_only_while_training_also_read_back_exactly(tmp_path):
    r = simulate(_cfg(fail_in_recovery=False, seed=21), trace=True)
    assert all(c["recovered"] for c in r.trace[:-1])  # no recovery is ever cut short
    write(r, tmp_path, step_s=5.0)
    report = compute(read_merged(tmp_path))
    sim = to_report({b: float(v[0]) for b, v in r.buckets.items()})
    for name in REPORT_BUCKETS:
        assert report.buckets[name] == pytest.approx(sim[name], abs=1e-3), name
