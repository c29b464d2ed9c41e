"""The loss and gradient-norm anomaly policy over plain floats: what is not finite, what spikes over
the running median and MAD after the warm-up, and when skipped AMP steps become an anomaly."""

from __future__ import annotations

import math

import pytest

from stalwart.policy.loss_anomaly import (
    GRAD_NORM_SETTINGS,
    LOSS_SETTINGS,
    NO_ESTIMATE,
    AnomalyKind,
    AnomalySettings,
    Signal,
    estimate,
    judge,
    judge_skips,
)

CFG = AnomalySettings(window=50, warmup=10, threshold=6.0, min_rise=0.2)


def _judge(value, history, cfg=CFG, signal=Signal.LOSS):
    return judge(value, estimate(history), signal=signal, step=99, cfg=cfg)


def test_median_and_mad_are_the_robust_ones():
    est = estimate([1.0, 2.0, 3.0, 4.0, 100.0])
    assert (est.median, est.mad, est.count) == (3.0, 1.0, 5)
    assert estimate([4.0, 1.0, 3.0, 2.0]).median == 2.5
    assert estimate([]) == NO_ESTIMATE


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_value_that_is_not_finite_is_an_anomaly_even_while_warming_up(bad):
    j = judge(bad, NO_ESTIMATE, signal=Signal.LOSS, step=3, cfg=CFG)
    assert j.kind is AnomalyKind.NONFINITE and j.anomalous
    assert "loss at step 3" in j.reason and "not finite" in j.reason


def test_no_spike_is_judged_before_the_warm_up():
    j = _judge(1000.0, [1.0] * 9)
    assert j.kind is AnomalyKind.WARMING_UP and not j.anomalous and "9/10" in j.reason


def test_a_spike_is_far_above_the_median_in_robust_deviations_and_in_share_of_the_median():
    history = [2.0 + 0.01 * ((i * 7) % 11 - 5) for i in range(40)]  # 2.0 +- 0.05
    j = _judge(6.0, history)
    assert j.kind is AnomalyKind.SPIKE and j.anomalous and j.score > 6
    assert j.est.count == 40 and j.est.median == pytest.approx(2.0, abs=0.01)
    assert (
        "robust standard deviations above its running median 2" in j.reason and "over the last 40" in j.reason
    )
    # far in deviations but a rise under 20 % of the median: a quiet loss moving a little is no spike
    assert _judge(2.3, history).kind is AnomalyKind.NONE
    # below the median, however far: a loss that falls is never an anomaly
    assert _judge(0.1, history).kind is AnomalyKind.NONE


def test_a_flat_loss_takes_one_percent_of_its_median_as_its_least_spread():
    flat = [1.0] * 20  # MAD 0
    assert _judge(1.05, flat).kind is AnomalyKind.NONE  # 5 sigma of the floor, and a 5 % rise
    assert _judge(1.5, flat).kind is AnomalyKind.SPIKE


def test_a_gradient_norm_must_at_least_double():
    history = [1.0 + 0.02 * ((i * 5) % 9 - 4) for i in range(40)]
    assert _judge(5.0, history, GRAD_NORM_SETTINGS, Signal.GRAD_NORM).kind is AnomalyKind.WARMING_UP
    history = history * 2  # past the warm-up of 50
    assert _judge(1.8, history, GRAD_NORM_SETTINGS, Signal.GRAD_NORM).kind is AnomalyKind.NONE
    j = _judge(5.0, history, GRAD_NORM_SETTINGS, Signal.GRAD_NORM)
    assert j.kind is AnomalyKind.SPIKE and j.signal is Signal.GRAD_NORM and "grad_norm at step 99" in j.reason


def test_skipped_steps_are_an_anomaly_only_once_a_run_of_them_reaches_the_limit():
    cfg = LOSS_SETTINGS
    kinds = [judge_skips(n, step=n, cfg=cfg).kind for n in range(1, cfg.max_skipped + 3)]
    assert kinds.count(AnomalyKind.SKIP_RUN) == 1 and kinds[cfg.max_skipped - 1] is AnomalyKind.SKIP_RUN
    one = judge_skips(1, step=7, cfg=cfg)
    assert one.signal is Signal.SCALER and "not an anomaly" in one.reason


@pytest.mark.parametrize(
    "kw",
    [
        dict(window=2, warmup=1),
        dict(window=10, warmup=11),
        dict(threshold=0),
        dict(min_rise=-1),
        dict(max_skipped=0),
    ],
)
def test_settings_that_cannot_work_are_refused(kw):
    with pytest.raises(ValueError):
        AnomalySettings(**kw)
