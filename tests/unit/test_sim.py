"""The simulator against closed forms (where their assumptions hold) and published counts."""

import numpy as np
import pytest

from stalwart.account.ettr import daly_ettr
from stalwart.errors import ConfigError
from stalwart.sim import CheckpointTier, FailureClass, SimConfig, simulate
from stalwart.sim.config import LLAMA3_TABLE5, make_config
from stalwart.sim.engine import BUCKETS


def one_class(mtbf_s, gpus=1024, node_loss=False, detect_s=0.0):
    per = 1000.0 / (mtbf_s / 86400.0 * gpus)  # failures per 1000 GPU-days giving that job MTBF
    return [FailureClass(name="x", per_1000_gpu_days=per, node_loss=node_loss, detect_s=detect_s)]


@pytest.mark.parametrize("tau,delta,restart", [(1800, 30, 600), (600, 60, 300), (7200, 300, 1200)])
def test_agrees_with_daly_where_his_assumptions_hold(tau, delta, restart):
    # Daly's assumptions: Poisson failures, instant detection, fixed interruptible restart, failures
    # during checkpoints lose the cycle, work >> interval. Horizon: 300 MTBFs.
    mtbf = 3 * 3600.0
    cfg = SimConfig(
        gpus=1024,
        days=300 * mtbf / 86400,
        trials=300,
        seed=7,
        failures=one_class(mtbf),
        planned_per_1000_gpu_days=0,
        decide_s=0,
        tiers=[CheckpointTier(name="a", interval_s=tau, stall_s=delta, restore_s=0)],
        job_restart_s=restart,
    )
    r = simulate(cfg)
    se = r.ettr.std() / np.sqrt(cfg.trials)
    # 4 standard errors for sampling, plus 0.002 for the finite horizon (the initial start-up and the
    # last, unfinished cycle are not in Daly's steady state; both are O(restart/horizon))
    assert abs(r.ettr.mean() - daly_ettr(tau, delta, restart, mtbf)) < 4 * se + 0.002


def test_llama3_interruption_counts():
    # Default mix = Llama 3 Table 5 over 16,384 GPUs and 54 days. With zero downtime the job is
    # exposed all 54 days, so the count is Poisson(419) (+ Poisson(47) planned). The mean of 1000
    # trials has standard error sqrt(419/1000) = 0.65; 4 SE = 2.6.
    cfg = SimConfig(
        trials=1000,
        seed=3,
        decide_s=0,
        job_restart_s=0,
        failures=[
            FailureClass(name=n, per_1000_gpu_days=c / (16.384 * 54), node_loss=nl, detect_s=0)
            for n, c, nl, _ in LLAMA3_TABLE5
        ],
        tiers=[CheckpointTier(name="a", interval_s=1800, stall_s=0, restore_s=0)],
    )
    r = simulate(cfg)
    assert r.interruptions.mean() == pytest.approx(419, abs=2.6)
    assert r.planned.mean() == pytest.approx(47, abs=4 * np.sqrt(47 / 1000))
    share = r.by_class["faulty_gpu"].sum() / r.interruptions.sum()
    assert share == pytest.approx(148 / 419, abs=0.01)  # binomial SE of the share ~0.0007


def test_buckets_sum_to_the_horizon():
    cfg = SimConfig(
        gpus=4096,
        days=20,
        trials=200,
        seed=1,
        spare_nodes=2,
        elastic=True,
        straggler_per_node_day=0.01,
        straggler_slowdown=0.3,
        tiers=[
            CheckpointTier(name="mem", interval_s=300, stall_s=2, restore_s=20, survives_node_loss=False),
            CheckpointTier(name="fs", interval_s=1800, stall_s=30, restore_s=300),
        ],
    )
    r = simulate(cfg)
    total = sum(r.buckets[k] for k in BUCKETS)
    np.testing.assert_allclose(total, cfg.horizon_s, rtol=1e-9)
    assert (r.buckets["shrunk"] + r.buckets["straggler_slowdown"] > 0).all()
    assert np.all((r.ettr > 0) & (r.ettr < 1))


def test_waiting_for_repair_without_spares():
    # every failure costs a node; no spare, no shrinking: each failure waits exactly repair_hours
    cfg = SimConfig(
        gpus=64,
        days=30,
        trials=50,
        seed=2,
        failures=one_class(86400.0, gpus=64, node_loss=True),
        planned_per_1000_gpu_days=0,
        decide_s=0,
        spare_nodes=0,
        repair_hours=1.0,
        tiers=[CheckpointTier(name="a", interval_s=600, stall_s=0, restore_s=0)],
    )
    r = simulate(cfg)
    # failures that land within the last hour are truncated by the horizon, hence <=
    assert (r.buckets["wait_nodes"] <= r.interruptions * 3600 + 1e-6).all()
    assert r.buckets["wait_nodes"].sum() > 0.9 * r.interruptions.sum() * 3600


def test_spares_and_elastic_help():
    base = dict(gpus=8192, days=14, trials=200, seed=4, repair_hours=48.0)
    none = simulate(SimConfig(spare_nodes=0, **base)).ettr.mean()
    some = simulate(SimConfig(spare_nodes=16, **base)).ettr.mean()
    pool = simulate(SimConfig(spare_nodes=None, **base)).ettr.mean()
    shrink = simulate(SimConfig(spare_nodes=0, elastic=True, min_nodes_fraction=0.5, **base)).ettr.mean()
    assert none < some <= pool + 0.005
    assert none < shrink


def test_fast_tier_and_in_process_restart_help_against_software_faults():
    soft = one_class(2 * 3600.0, gpus=1024, node_loss=False, detect_s=30)
    base = dict(gpus=1024, days=20, trials=200, seed=5, failures=soft, planned_per_1000_gpu_days=0)
    slow = SimConfig(tiers=[CheckpointTier(name="fs", interval_s=3600, stall_s=60, restore_s=300)], **base)
    tiered = SimConfig(
        tiers=[
            CheckpointTier(name="mem", interval_s=300, stall_s=1, restore_s=10, survives_node_loss=False),
            CheckpointTier(name="fs", interval_s=3600, stall_s=60, restore_s=300),
        ],
        **base,
    )
    assert simulate(tiered).ettr.mean() > simulate(slow).ettr.mean() + 0.05
    inproc = SimConfig(strategy="in_process", **{**base, "seed": 6})
    requeue = SimConfig(strategy="requeue", **{**base, "seed": 6})
    assert simulate(inproc).ettr.mean() > simulate(requeue).ettr.mean() + 0.1


def test_same_seed_same_result():
    a = simulate(SimConfig(trials=50, days=5, seed=9))
    b = simulate(SimConfig(trials=50, days=5, seed=9))
    np.testing.assert_array_equal(a.ettr, b.ettr)


@pytest.mark.parametrize("spares", [None, 2])  # 2 spares: trials wait for repairs (the second pass)
def test_the_result_does_not_depend_on_the_number_of_threads(spares):
    cfg = SimConfig(gpus=16384, trials=1000, days=20, seed=3, spare_nodes=spares, straggler_per_node_day=0.01)
    one = simulate(cfg, workers=1)
    assert one.iterations == (2 if spares else 1)  # the cases this test is for: several chunks, two passes
    for n in (2, 3):
        many = simulate(cfg, workers=n)
        for b in BUCKETS:
            np.testing.assert_array_equal(one.buckets[b], many.buckets[b], err_msg=f"{b} with {n} threads")
        np.testing.assert_array_equal(one.interruptions, many.interruptions)


@pytest.mark.parametrize(
    "values,match",
    [
        ({"gpus": 0}, "gpus"),
        ({"gpus": 100, "gpus_per_node": 8}, "whole number"),
        ({"failures": [{"name": "x", "per_1000_gpu_days": -1.0}]}, "per_1000_gpu_days"),
        (
            {
                "tiers": [
                    {"name": "a", "interval_s": 100, "stall_s": 1},
                    {"name": "b", "interval_s": 250, "stall_s": 1},
                ]
            },
            "multiple",
        ),
        (
            {"tiers": [{"name": "a", "interval_s": 100, "stall_s": 1, "survives_node_loss": False}]},
            "survives",
        ),
        ({"days": 0.001, "tiers": [{"name": "a", "interval_s": 3600, "stall_s": 1}]}, "units"),
    ],
)
def test_bad_config_is_one_config_error(values, match):
    with pytest.raises(ConfigError, match=match):
        make_config(**values)


def test_the_commands_allocator_setting_applies_on_glibc_and_leaves_results_alone():
    import platform

    from stalwart.sim.alloc import keep_freed_memory

    cfg = SimConfig(trials=50, days=5, seed=4, spare_nodes=2)
    before = simulate(cfg)
    applied = keep_freed_memory()
    assert applied == (platform.libc_ver()[0] == "glibc")
    np.testing.assert_array_equal(simulate(cfg).ettr, before.ettr)
