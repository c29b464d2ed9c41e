import pytest

from stalwart.errors import ConfigError
from stalwart.sim.config import make_config
from stalwart.sim.engine import MAX_EXPECTED_INTERRUPTIONS, simulate


def test_a_rate_that_cannot_finish_is_a_clear_error_not_a_hang():
    base = make_config(gpus=16384, days=54, trials=2)
    scale = 1e6  # a chaos run's rate: thousands of times a real fleet's
    cfg = make_config(
        gpus=16384,
        days=54,
        trials=2,
        failures=[
            {**f.model_dump(), "per_1000_gpu_days": f.per_1000_gpu_days * scale} for f in base.failures
        ],
    )
    assert cfg.failure_rate_per_s() * cfg.horizon_s > MAX_EXPECTED_INTERRUPTIONS
    with pytest.raises(ConfigError, match="interruptions expected per trial"):
        simulate(cfg)


def test_the_published_scale_stays_well_inside_the_guard():
    cfg = make_config(gpus=100_000, days=365, trials=1)
    assert cfg.failure_rate_per_s() * cfg.horizon_s < MAX_EXPECTED_INTERRUPTIONS / 2
