"""Planner and ledger fitting: recommendations follow the closed forms and respond to the inputs."""

import pytest

from stalwart.account.ettr import daly_interval
from stalwart.errors import LedgerError
from stalwart.events import (
    AttemptStarted,
    CheckpointCommitted,
    DecisionTaken,
    FailureDetected,
    JobEnded,
    JobStarted,
    StepCompleted,
    TrainingResumed,
)
from stalwart.sim import CheckpointTier, SimConfig
from stalwart.sim.evidence import RateSource
from stalwart.sim.measured import config_from_events
from stalwart.sim.planner import closed_form_intervals, plan


def test_single_tier_interval_is_daly_against_the_job_mtbf():
    cfg = SimConfig(gpus=16384, days=10, trials=20)
    (advice,) = closed_form_intervals(cfg)
    lam = sum(f.per_1000_gpu_days for f in cfg.failures) * 16384 / 1000 / 86400
    assert advice.closed_form_s == pytest.approx(daly_interval(30.0, 1 / lam))
    assert 780 < advice.closed_form_s < 815  # 30 s stall, 3.09 h MTBF: ~ sqrt(2*30*11135) - 30 + O(1)


def test_two_tiers_are_snapped_to_multiples():
    cfg = SimConfig(
        gpus=16384,
        days=10,
        trials=20,
        tiers=[
            CheckpointTier(name="mem", interval_s=60, stall_s=1, restore_s=5, survives_node_loss=False),
            CheckpointTier(name="fs", interval_s=600, stall_s=30, restore_s=300),
        ],
    )
    mem, fs = closed_form_intervals(cfg)
    assert mem.recommended_s < fs.recommended_s
    assert (fs.recommended_s / mem.recommended_s) == pytest.approx(
        round(fs.recommended_s / mem.recommended_s)
    )


def test_plan_end_to_end_small():
    cfg = SimConfig(gpus=2048, days=7, trials=40, seed=1)
    p = plan(cfg, scale_to=[8192], trials=40, spare_candidates=(0, 2, 8))
    assert p.strategy.value == "in_process"  # 60 s restarts beat 300 s and 1800 s ones
    assert [pt.gpus for pt in p.scale] == [2048, 8192]
    assert p.scale[0].ettr_mean > p.scale[1].ettr_mean  # more GPUs, more failures
    assert p.scale[1].job_mtbf_h == pytest.approx(p.scale[0].job_mtbf_h / 4)
    assert p.spares.value in (0, 2, 8) and p.spares.reason
    best = max(p.sweep, key=lambda r: r["ettr_sim"])
    # the simulated optimum sits within a factor 2 of the recommended interval
    assert 0.5 <= best["interval_s"] / p.tiers[0].recommended_s <= 2.0


def _ledger_events(fail=True, failures=1):
    t = 2_000_000.0
    evs = [
        JobStarted(ts=t, script="x"),
        AttemptStarted(ts=t, world_size=8, num_nodes=1, node="a", attempt=0),
        StepCompleted(ts=t + 10, step=0, start=t, duration=10),
        CheckpointCommitted(ts=t + 20, step=1, path="p", stall_s=0.5),
        CheckpointCommitted(ts=t + 40, step=2, path="p", stall_s=1.5),
    ]
    for n in range(failures if fail else 0):  # one crash every 500 s, each 10 s to detect, 40 s to restart
        c = t + 500 * n
        evs += [
            FailureDetected(ts=c + 100, onset=c + 90, failure="crash", evidence="Xid 79", node="a"),
            DecisionTaken(ts=c + 101, action="restart", reason="r"),
            AttemptStarted(ts=c + 110, world_size=8, num_nodes=1, node="a", attempt=n + 1),
            TrainingResumed(ts=c + 130, step=2),
            StepCompleted(ts=c + 141, step=2, start=c + 131, duration=10),
        ]
    evs.append(JobEnded(ts=t + 3600, verdict="ok", outcome="succeeded", exit_code=0, requeue_helps=False))
    return evs


def test_config_from_events_uses_measured_values():
    got = config_from_events(_ledger_events(failures=6), SimConfig(gpus=8, days=1, trials=10))
    cfg, notes = got.cfg, got.notes
    # six failures in 8 GPU-hours = 18 per GPU-day = 18000 per 1000 GPU-days
    assert sum(f.per_1000_gpu_days for f in cfg.failures) == pytest.approx(18000.0)
    assert all(f.detect_s == 10 for f in cfg.failures)
    assert cfg.decide_s == 1 and cfg.job_restart_s == 40
    assert cfg.tiers[0].stall_s == pytest.approx(1.0) and cfg.tiers[0].restore_s == 0
    assert any("6 interruptions" in n for n in notes) and got.rates.source is RateSource.MEASURED


def test_one_failure_keeps_the_published_rates_but_uses_its_times():
    base = SimConfig(gpus=8, days=1, trials=10)
    got = config_from_events(_ledger_events(), base)
    assert [f.per_1000_gpu_days for f in got.cfg.failures] == [f.per_1000_gpu_days for f in base.failures]
    assert all(f.detect_s == 10 for f in got.cfg.failures) and got.cfg.job_restart_s == 40
    assert got.rates.source is RateSource.PUBLISHED and "too little" in got.notes[0]


def test_config_from_events_without_failures_keeps_rates():
    base = SimConfig(gpus=8, days=1, trials=10)
    got = config_from_events(_ledger_events(fail=False), base)
    assert got.cfg.failures == base.failures
    assert any("no infrastructure failure" in n for n in got.notes)


def test_empty_ledger_events_are_an_error():
    with pytest.raises(LedgerError):
        config_from_events([], SimConfig(gpus=8, days=1, trials=10))


def _paired_gap(a, b) -> tuple[float, float]:
    """Mean of a - b over trials and its standard error (the trials share their draws)."""
    d = a.ettr - b.ettr
    return float(d.mean()), float(d.std(ddof=1) / len(d) ** 0.5) if len(d) > 1 else 0.0


@pytest.mark.parametrize("job_restart_s", [0.5, 300.0])
def test_faster_recovery_options_never_lose_ettr_to_cold(job_restart_s):
    """A ledger measured a 0.5 s job restart while the in-place restart kept its 60 s default guess: warm,
    peer and hot spares came out below cold. Restarting in place is never slower than a job restart."""
    from stalwart.sim.engine import simulate
    from stalwart.sim.planner import option_config

    base = SimConfig(gpus=1024, days=7, trials=60, seed=3, job_restart_s=job_restart_s, spare_nodes=16)
    for gpus in (1024, 4096, 16384):
        c = base.model_copy(update={"gpus": gpus})
        cold = simulate(option_config(c, "cold"))
        for opt in ("warm", "peer", "hot_spares"):
            r = simulate(option_config(c, opt))
            gap, se = _paired_gap(r, cold)
            assert gap >= -3.0 * se - 1e-9, (gpus, opt, gap, se)
            if job_restart_s > c.in_process_restart_s:  # here the in-place restart is really faster
                assert gap > 0.0, (gpus, opt)


def test_scale_rechooses_spares_so_a_small_fleet_does_not_wait_for_repairs():
    """32 spares for 16,384 GPUs scaled in proportion gave 1,024 GPUs 2 spares: the job waited ~4% of the
    time for repaired nodes and its ETTR fell below that of 16,384 GPUs, which fail 16x more often."""
    import math

    from stalwart.sim.engine import simulate
    from stalwart.sim.planner import _apply

    cfg = SimConfig(
        gpus=16384,
        trials=40,
        seed=2,
        job_restart_s=0.5,
        tiers=[CheckpointTier(name="fs", interval_s=30, stall_s=0.05, restore_s=0.2)],
    )
    p = plan(cfg, scale_to=[1024], trials=40, spare_candidates=(32,))
    small = next(pt for pt in p.scale if pt.gpus == 1024)
    big = next(pt for pt in p.scale if pt.gpus == 16384)
    assert big.spare_nodes == 32
    proportional = _apply(
        cfg.model_copy(update={"gpus": 1024, "spare_nodes": math.ceil(32 * 1024 / 16384)}),
        {"fs": small.interval_s},
    )
    starved = simulate(proportional.model_copy(update={"strategy": p.strategy.value}))
    reserved = 1024 + 8 * small.spare_nodes
    # the chosen count gives more productive GPU-hours per reserved GPU-hour than the proportional one
    assert small.ettr_mean * 1024 / reserved > float(starved.ettr.mean()) * 1024 / (1024 + 8 * 2)
    assert small.wait_share < float(starved.buckets["wait_nodes"].mean()) / cfg.horizon_s
    # what is left of the wait is reported, and it explains the gap to the big fleet
    assert small.ettr_mean + small.wait_share >= big.ettr_mean - 0.01


def test_recovery_options_are_an_enum_with_the_plans_words():
    from stalwart.sim.planner import OPTIONS, RecoveryOption, option_config

    assert OPTIONS == ("cold", "warm", "peer", "in_place", "replica", "hot_spares", "elastic")
    base = SimConfig(gpus=1024, days=7, trials=10, spare_nodes=16)
    for word, opt in zip(OPTIONS, RecoveryOption, strict=True):
        assert option_config(base, word) == option_config(base, opt)  # the word or the enum
    assert option_config(base, "elastic").elastic and option_config(base, "replica").strategy == "replica"
    assert option_config(base, "in_place").no_rollback and not option_config(base, "warm").no_rollback
    with pytest.raises(ValueError, match="unknown recovery option 'lukewarm'"):
        option_config(base, "lukewarm")
