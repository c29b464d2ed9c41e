"""The incident cost stack: each layer, progress lost, run totals, validation."""

import pytest
from pydantic import ValidationError

from stalwart.account.cost import Incident, Prices, incident_cost, run_cost
from stalwart.errors import ConfigError

PRICES = Prices(gpu_hour=2.0, opportunity_gpu_hour=1.0, engineer_hour=100.0, slip_per_day=24_000.0)


def test_each_layer():
    # 1024 GPUs down 30 min, 1 h of work re-done, 2 h at 25% slower before the stop, 8 nodes in repair
    # for 48 h, two responders for 1.5 h each
    inc = Incident(
        gpus=1024,
        downtime_s=1800,
        lost_work_s=3600,
        degraded_s=7200,
        degraded_fraction=0.25,
        excluded_gpus=8,
        excluded_s=48 * 3600,
        responder_hours=3.0,
        step_time_s=6.0,
        tokens_per_step=4e6,
        label="xid79",
    )
    s = incident_cost(inc, PRICES)
    assert s.compute_waste == pytest.approx(1024 * 1.5 * 2.0)
    assert s.opportunity == pytest.approx((1024 * 0.5 + 8 * 48) * 1.0)
    assert s.regression == pytest.approx(1024 * 0.5 * 2.0)
    assert s.labor == pytest.approx(300.0)
    assert s.wall_hours_lost == pytest.approx(2.0)
    assert s.schedule_slip == pytest.approx(2.0 / 24 * 24_000)
    assert s.total == pytest.approx(3072 + 896 + 1024 + 300 + 2000)
    assert s.gpu_hours_lost == pytest.approx(2048)
    assert s.steps_lost == pytest.approx(1200) and s.tokens_lost == pytest.approx(4.8e9)


def test_progress_unknown_without_step_time():
    s = incident_cost(Incident(gpus=8, downtime_s=60), PRICES)
    assert s.steps_lost is None and s.tokens_lost is None


def test_run_total_is_the_sum():
    incs = [
        Incident(gpus=8, downtime_s=600, lost_work_s=60, step_time_s=1),
        Incident(gpus=8, downtime_s=60, responder_hours=1, step_time_s=1),
    ]
    stacks, run = run_cost(incs, PRICES)
    assert run.total == pytest.approx(sum(s.total for s in stacks))
    assert run.steps_lost == pytest.approx(720)


def test_validation():
    with pytest.raises(ConfigError, match="GPUs"):
        Incident(gpus=0, downtime_s=1)
    with pytest.raises(ConfigError, match="downtime_s"):
        Incident(gpus=1, downtime_s=-5)
    with pytest.raises(ConfigError, match="degraded_fraction"):
        Incident(gpus=1, downtime_s=1, degraded_fraction=1.5)
    with pytest.raises(ValidationError):
        Prices(gpu_hour=-1)
