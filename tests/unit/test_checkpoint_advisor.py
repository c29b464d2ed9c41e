import math

import pytest

from stalwart.checkpoint.advisor import AutoInterval, advise, advise_tier, daly_interval, young_interval
from stalwart.checkpoint.tiers import TierConfig, default_tiers, validate_tiers
from stalwart.errors import ConfigError
from stalwart.events.checkpoint import CheckpointIntervalAdvised


def test_young_and_daly_match_hand_computed_values():
    # C = 10 s, M = 3600 s: sqrt(2*10*3600) = 268.328...
    assert young_interval(10, 3600) == pytest.approx(268.3282, abs=1e-3)
    # Daly: 268.328 * (1 + 0.037268/3 + 0.0013889/9) - 10 = 261.703...
    assert daly_interval(10, 3600) == pytest.approx(261.7029, abs=1e-3)
    assert daly_interval(5000, 2000) == 2000  # delta >= 2M: checkpoint every MTBF


def test_stall_drives_the_interval_and_persist_is_a_floor():
    a = advise_tier("mem", "memory", stall_s=0.05, persist_s=0.2, mtbf_s=3 * 3600, step_time_s=1.0)
    assert a.interval_s == pytest.approx(daly_interval(0.05, 3 * 3600))
    assert a.interval_steps == round(a.interval_s)
    slow = advise_tier("obj", "object", stall_s=0.05, persist_s=300.0, mtbf_s=3 * 3600, step_time_s=1.0)
    assert slow.interval_s == pytest.approx(360.0) and "persist takes 300.0s" in slow.reason
    tiny = advise_tier("mem", "memory", stall_s=1e-4, persist_s=0.0, mtbf_s=10.0, step_time_s=5.0)
    assert tiny.interval_steps == 1 and "below one step" in tiny.reason


def test_slower_tiers_get_longer_intervals_when_they_cover_rarer_failures():
    tiers = [("mem", "memory"), ("disk", "local"), ("fs", "shared")]
    out = advise(
        tiers,
        stall_s=0.1,
        persist_s={},
        mtbf_s=3600,
        step_time_s=0.5,
        memory_loss_fraction=0.4,
        node_loss_fraction=0.1,
    )
    assert (
        out[0].mtbf_s == 3600
        and out[1].mtbf_s == pytest.approx(9000)
        and out[2].mtbf_s == pytest.approx(36000)
    )
    assert out[0].interval_steps < out[1].interval_steps < out[2].interval_steps
    assert out[2].interval_s == pytest.approx(daly_interval(0.1, 36000))


@pytest.mark.parametrize(
    "kw", [{"mtbf_s": 0}, {"step_time_s": -1}, {"node_loss_fraction": 0}, {"memory_loss_fraction": 1.5}]
)
def test_bad_inputs_raise_config_error(kw):
    args = dict(stall_s=0.1, persist_s=1.0, mtbf_s=3600, step_time_s=1.0) | kw
    with pytest.raises(ConfigError):
        advise_tier("mem", "memory", **args)


class FakeEngine:
    def __init__(self):
        self.tiers = [
            TierConfig(name="mem", kind="memory", location="/a", every_steps=10),
            TierConfig(name="disk", kind="local", location="/b", every_steps=50),
        ]
        self.last_stall_s = None
        self.last_persist_s = {}
        self.rank = 0

    def tier(self, name):
        return next(t for t in self.tiers if t.name == name)

    def set_interval(self, name, n):
        self.tiers = [t.model_copy(update={"every_steps": n}) if t.name == name else t for t in self.tiers]

    def due_tiers(self, step):
        return [t for t in self.tiers if step % t.every_steps == 0]


def test_auto_mode_applies_advice_and_reports_it():
    eng, events = FakeEngine(), []
    auto = AutoInterval(
        eng, mtbf_s=3600, every_steps=5, sink=events.append, wall=lambda: 1.0, memory_loss_fraction=0.5
    )
    assert auto.observe_step(0, 2.0) == []  # nothing measured yet
    eng.last_stall_s, eng.last_persist_s = 0.5, {"mem": 0.1, "disk": 4.0}
    advice = auto.observe_step(1, 2.0)
    expect_mem = round(daly_interval(0.5, 3600) / 2.0)
    expect_disk = round(daly_interval(0.5, 7200) / 2.0)
    assert [a.interval_steps for a in advice] == [expect_mem, expect_disk]
    assert eng.tier("mem").every_steps == expect_mem and eng.tier("disk").every_steps == expect_disk
    assert [e.tier for e in events if isinstance(e, CheckpointIntervalAdvised)] == ["mem", "disk"]
    assert auto.observe_step(2, 2.0) == []  # not yet time to re-advise
    assert auto.should_save(expect_mem * expect_disk)


def test_advice_only_mode_leaves_intervals_alone():
    eng = FakeEngine()
    eng.last_stall_s = 0.5
    AutoInterval(eng, mtbf_s=3600, apply=False).observe_step(0, 1.0)
    assert eng.tier("mem").every_steps == 10


def test_default_tiers_keep_fast_tiers_frequent(tmp_path):
    tiers = default_tiers(
        local_dir=str(tmp_path), job="j", base_every_steps=10, shared_dir="/mnt/fs", object_url="memory://b/c"
    )
    assert [t.kind for t in tiers] == ["memory", "local", "shared", "object"]
    every = [t.every_steps for t in tiers]
    assert every == sorted(every) and every[0] == 10
    assert not tiers[0].do_fsync and tiers[1].do_fsync and not tiers[0].durable


def test_tier_validation_errors():
    with pytest.raises(ConfigError, match="no checkpoint tier"):
        validate_tiers([])
    a = TierConfig(name="x", kind="local", location="/a")
    with pytest.raises(ConfigError, match="duplicate"):
        validate_tiers([a, TierConfig(name="x", kind="local", location="/b")])
    with pytest.raises(ConfigError, match="share a location"):
        validate_tiers([a, TierConfig(name="y", kind="shared", location="/a")])
    with pytest.raises(ValueError):
        TierConfig(name="z", kind="local", location="/c", every_steps=0)
    assert math.isfinite(young_interval(1, 1))
