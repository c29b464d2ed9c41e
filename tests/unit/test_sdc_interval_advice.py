"""How often replicas should compare their state (sim/sdc.py): the square-root law between the
checks' cost and late detection, bounded by the budget and by the checkpoint interval."""

from __future__ import annotations

import math

import pytest

from stalwart.sim.sdc import advise, check_seconds, sdc_per_gpu_s


def test_llama3s_rate_is_six_in_54_days_at_16384_gpus():
    assert sdc_per_gpu_s() * 16_384 * 54 * 86_400 == pytest.approx(6.0)


def test_the_optimum_follows_the_square_root_law_and_its_costs_balance():
    a = advise(0.04, 5.0, 16_384)
    rate = sdc_per_gpu_s() * 16_384
    assert a.interval_steps == round(math.sqrt(2 * 0.04 / rate) / 5.0)
    late = rate * a.interval_steps * 5.0 / 2  # per second of training
    assert a.overhead == pytest.approx(late, rel=0.05)  # at the optimum the two costs are equal
    assert "square-root law" in a.reason


def test_the_budget_bounds_how_often_and_a_save_how_seldom():
    tight = advise(0.004, 0.016, 16_384, budget=0.01)  # 4 ms checks, 16 ms steps: at most 1% of the time
    assert tight.overhead <= 0.01 + 1e-9 and tight.interval_steps >= 25
    seldom = advise(0.003, 0.016, 8, checkpoint_every_s=60.0)  # 8 GPUs: the optimum is days away
    assert seldom.interval_steps == 3750 and "checkpoint save checks anyway" in seldom.reason


def test_a_check_costs_a_pass_over_the_state_and_a_gather():
    assert check_seconds(2e9, pass_gbps=1000.0) == pytest.approx(0.004)
    with pytest.raises(ValueError):
        advise(0.0, 1.0, 8)
