"""Closed forms against hand-computed values, Daly's own claims, and the first-order ETTR model."""

import math

import pytest

from stalwart.account import ettr
from stalwart.errors import ConfigError


def test_young_hand_computed_example():
    # delta = 5 min, M = 24 h: sqrt(2 * 300 * 86400) = 7200 s exactly (2 h)
    assert ettr.young_interval(300, 86400) == pytest.approx(7200.0, rel=1e-12)


def test_daly_reduces_to_young_minus_delta_for_small_delta():
    # Daly's series: sqrt(2dM) * (1 + x^0.5/3 + x/9) - d with x = d/2M; for d << M the correction
    # terms vanish and tau -> sqrt(2dM) - d + O(d). Check the exact series value for d=300, M=86400.
    x = 300 / (2 * 86400)
    expected = 7200.0 * (1 + math.sqrt(x) / 3 + x / 9) - 300
    assert ettr.daly_interval(300, 86400) == pytest.approx(expected, rel=1e-12)
    assert ettr.daly_interval(300, 86400) < ettr.young_interval(300, 86400)


def test_daly_interval_is_mtbf_when_checkpoint_longer_than_two_mtbf():
    assert ettr.daly_interval(7300, 3600) == 3600


@pytest.mark.parametrize(
    "delta,mtbf,tol",
    [
        (300, 86400, 1e-4),  # delta/M = 0.0035: Daly claims the estimate is near-exact here
        (60, 11135, 1e-4),  # Llama-3-like job MTBF (54 d * 24 h / 419 = 3.09 h), 1-minute stall
        (600, 3600, 2e-3),  # delta/M = 0.17
        (1800, 3600, 1e-2),  # delta/M = 0.5: the perturbation series is visibly approximate
    ],
)
def test_daly_estimate_matches_numeric_optimum_of_his_wall_time(delta, mtbf, tol):
    # Daly (2006) shows his higher-order estimate tracks the true optimum of T_w for delta < 2M,
    # with error growing with delta/M; tolerances follow that growth.
    numeric = ettr.daly_numeric_optimum(delta, 0.0, mtbf)
    assert ettr.daly_interval(delta, mtbf) == pytest.approx(numeric, rel=tol)


def test_restart_time_does_not_move_the_optimum():
    # R enters T_w only as the factor exp(R/M): the optimum is independent of R
    a = ettr.daly_numeric_optimum(120, 0, 10_000)
    b = ettr.daly_numeric_optimum(120, 3000, 10_000)
    assert a == pytest.approx(b, rel=1e-6)


def test_daly_wall_time_limits():
    # no failures in practice (M huge): wall time = work * (1 + delta/tau)
    tw = ettr.daly_wall_time(1e6, 3600, 60, 600, 1e15)
    assert tw == pytest.approx(1e6 * (3600 + 60) / 3600, rel=1e-6)
    assert ettr.daly_ettr(3600, 60, 600, 1e15) == pytest.approx(3600 / 3660, rel=1e-6)


def test_first_order_model_agrees_with_daly_when_failures_are_rare():
    # lambda * (R + tau) = (600 + 1800)/ (10 days) << 1: both models agree to 2nd order (~1e-4)
    nodes, rate = 100, 0.001  # 0.1 failures/day for the job
    m = ettr.job_mtbf_s(nodes, rate)
    first = ettr.expected_ettr_first_order(nodes, rate, 1800, 600, 30)
    exact = ettr.daly_ettr(1800, 30, 600, m)
    assert first == pytest.approx(exact, abs=5e-4)


def test_first_order_model_llama3_scale():
    # Llama 3: 419 unexpected interruptions in 54 days on 2048 nodes -> r_f = 419/(2048*54)
    rate = 419 / (2048 * 54)
    m = ettr.job_mtbf_s(2048, rate)
    assert m / 3600 == pytest.approx(54 * 24 / 419, rel=1e-12)  # 3.093 h between interruptions
    # Meta reports > 90% effective training time; with 10-min restarts that needs a short interval
    v = ettr.expected_ettr_first_order(2048, rate, 600, 600, 5)
    assert 0.85 < v < 0.95
    assert ettr.expected_ettr_first_order(2048, rate, 3600 * 4, 600, 5) < 0.5


def test_expected_lost_work_is_half_a_cycle():
    assert ettr.expected_lost_work(1800, 30) == 915


@pytest.mark.parametrize("args", [(-1, 100), (10, 0), (float("nan"), 10), (10, float("inf"))])
def test_bad_input_is_a_config_error(args):
    with pytest.raises(ConfigError):
        ettr.young_interval(*args)


def test_zero_nodes_is_an_error():
    with pytest.raises(ConfigError, match="nodes"):
        ettr.job_mtbf_s(0, 0.01)


def test_one_copy_of_the_interval_arithmetic():
    # the accounting checks its inputs, the checkpoint advisor does not: both run the policy's formula
    from stalwart.checkpoint import advisor
    from stalwart.policy import checkpoint_interval

    assert advisor.daly_interval is checkpoint_interval.daly_interval
    assert advisor.young_interval is checkpoint_interval.young_interval
    for delta, mtbf in ((300.0, 86400.0), (7300.0, 3600.0), (0.05, 10800.0)):
        assert ettr.daly_interval(delta, mtbf) == checkpoint_interval.daly_interval(delta, mtbf)
        assert ettr.young_interval(delta, mtbf) == checkpoint_interval.young_interval(delta, mtbf)
