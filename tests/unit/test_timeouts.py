"""Hang timeouts calibrated from step times, and the timeout hierarchy check."""

from __future__ import annotations

import pytest

from stalwart.errors import ConfigError
from stalwart.policy.timeouts import HangTimeoutPolicy, hang_timeout, p99, validate_hierarchy

POLICY = HangTimeoutPolicy(multiplier=3.0, floor_s=10.0, cap_s=600.0, startup_s=300.0, min_samples=5)


def test_p99_is_nearest_rank():
    assert p99([float(i) for i in range(1, 101)]) == 99.0
    # 10 samples: ceil(9.9) = 10 -> the largest
    assert p99([5.0, 1.0, 2.0, 3.0, 4.0, 6.0, 7.0, 8.0, 9.0, 10.0]) == 10.0
    assert p99([0.25]) == 0.25
    with pytest.raises(ValueError):
        p99([])


def test_startup_timeout_until_enough_samples():
    ht = hang_timeout([1.0, 1.0, 1.0, 1.0], POLICY)
    assert ht.seconds == 300.0 and not ht.calibrated and ht.samples == 4 and ht.p99_s == 0.0
    assert "4 of 5 steps" in ht.reason


def test_calibrated_from_p99_between_floor_and_cap():
    times = [5.0] * 199 + [7.0]  # p99 over 200 samples: rank 198 -> 5.0
    ht = hang_timeout(times, POLICY)
    assert ht.calibrated and ht.p99_s == 5.0 and ht.seconds == 15.0 and ht.samples == 200
    assert "3 x p99 step time 5.000s" in ht.reason
    ht = hang_timeout([5.0] * 98 + [7.0, 8.0], POLICY)  # 100 samples: rank 99 -> 7.0
    assert ht.seconds == pytest.approx(21.0)


def test_floor_applies_to_fast_steps():
    ht = hang_timeout([0.1] * 50, POLICY)
    assert ht.seconds == 10.0 and ht.calibrated
    assert "floor 10s" in ht.reason


def test_cap_applies_to_slow_steps():
    ht = hang_timeout([300.0] * 50, POLICY)
    assert ht.seconds == 600.0
    assert "cap 600s" in ht.reason


def _ok(**over):
    args = dict(
        monitor_interval_s=0.05, policy=POLICY, pg_timeout_s=900.0, rdzv_timeout_s=1200.0, stop_grace_s=3.0
    )
    args.update(over)
    validate_hierarchy(**args)


def test_valid_hierarchy_passes():
    _ok()


@pytest.mark.parametrize(
    "over, names, flag",
    [
        (dict(monitor_interval_s=10.0), ("monitor interval (10s)", "hang floor (10s)"), "--monitor-interval"),
        (dict(pg_timeout_s=600.0), ("hang cap (600s)", "process-group timeout (600s)"), "--hang-cap"),
        (dict(pg_timeout_s=500.0), ("hang cap (600s)", "process-group timeout (500s)"), "--pg-timeout"),
        (
            dict(rdzv_timeout_s=900.0),
            ("process-group timeout (900s)", "rendezvous timeout (900s)"),
            "--rdzv-timeout",
        ),
        (
            dict(policy=HangTimeoutPolicy(3.0, 10.0, 100.0, 1000.0, 5)),
            ("start-up timeout (1000s)", "process-group timeout (900s)"),
            "--startup-timeout",
        ),
        (
            dict(stop_grace_s=450.0),
            ("hold for a hang on another node (2 x stop grace) (900s)", "process-group timeout (900s)"),
            "--stop-grace",
        ),
    ],
)
def test_out_of_order_timeouts_name_the_pair_and_the_flags(over, names, flag):
    with pytest.raises(ConfigError) as exc:
        _ok(**over)
    assert exc.value.message.startswith("timeout order violated")
    for n in names:
        assert n in exc.value.message
    assert flag in exc.value.hint


def test_floor_above_cap_and_bad_values():
    with pytest.raises(ConfigError, match="hang floor 50s is above the hang cap 20s"):
        _ok(policy=HangTimeoutPolicy(3.0, 50.0, 20.0, 300.0, 5))
    with pytest.raises(ConfigError, match="positive"):
        _ok(policy=HangTimeoutPolicy(0.0, 10.0, 600.0, 300.0, 5))
    with pytest.raises(ConfigError, match="--stop-grace"):
        _ok(stop_grace_s=0.0)


@pytest.mark.parametrize(
    "over, names, flag",
    [
        (
            dict(store_timeout_s=1200.0),
            ("store timeout (1200s)", "rendezvous timeout (1200s)"),
            "--rdzv-conf read_timeout",
        ),
        (
            dict(store_timeout_s=5.0, keepalive_s=5.0),
            ("rendezvous keep-alive interval (5s)", "store timeout (5s)"),
            "--rdzv-conf keep_alive_interval",
        ),
        (
            dict(store_timeout_s=0.05),
            ("monitor interval (0.05s)", "store timeout (0.05s)"),
            "--monitor-interval",
        ),
    ],
)
def test_the_store_timeout_sits_between_the_keep_alive_and_the_rendezvous_timeout(over, names, flag):
    _ok(store_timeout_s=60.0, keepalive_s=1.0)
    with pytest.raises(ConfigError) as exc:
        _ok(**over)
    for n in names:
        assert n in exc.value.message
    assert flag in exc.value.hint
