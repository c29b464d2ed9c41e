"""Failures between steps (chaos faults) never land inside a save; the fitted exposure of a chaos run
runs until each fault, as the simulator's time at risk does."""

import numpy as np
import pytest

from stalwart.account.goodput import Segment
from stalwart.sim import CheckpointTier, FailureClass, SimConfig, simulate
from stalwart.sim.fit import _training_s

STALL = 40.0


def _cfg(**kw) -> SimConfig:
    values = dict(
        gpus=16,
        days=0.25,
        trials=4,
        seed=5,
        failures=[FailureClass(name="bug", per_1000_gpu_days=3000.0, node_loss=False, detect_s=15.0)],
        planned_per_1000_gpu_days=0.0,
        decide_s=0.0,
        job_restart_s=60.0,
        fail_in_recovery=False,
        # saves are most of the cycle, as beside a CPU hog: a failure drawn anywhere often lands in one
        tiers=[CheckpointTier(name="fs", interval_s=20.0, stall_s=STALL, restore_s=5.0)],
    )
    values.update(kw)
    return SimConfig(**values)


def _mid_save(trace: list[dict]) -> list[float]:
    """For every failed cycle: the part of a save in progress when the failure struck."""
    return [c["run"] - c["compute"] - c["checkpoints"] * STALL for c in trace if c["failed"]]


def test_a_failure_between_steps_waits_for_the_save_in_progress_to_end():
    anywhere = _mid_save(simulate(_cfg(), trace=True).trace)
    between = _mid_save(simulate(_cfg(fail_in_save=False), trace=True).trace)
    assert len(anywhere) > 10 and len(between) > 10
    assert any(x > 1.0 for x in anywhere), "drawn anywhere, some failures cut a save short"
    assert all(x == pytest.approx(0.0, abs=1e-6) for x in between), between


def test_failures_between_steps_lose_less_work_than_failures_anywhere():
    anywhere = simulate(_cfg(trials=50))
    between = simulate(_cfg(trials=50, fail_in_save=False))
    per = lambda r: r.buckets["lost_work"].mean() / r.interruptions.mean()  # noqa: E731
    assert per(between) < 20.0 < per(anywhere)  # at most one interval of compute, against a cut save too


def _seg(attempt: int, start: float, end: float) -> Segment:
    return Segment(
        node="n0", attempt=attempt, first_start=start, last_end=end, first_step=0, last_step=1, steps=2
    )


def test_a_chaos_runs_time_at_risk_runs_until_each_fault():
    segs = [_seg(0, 100.0, 150.0), _seg(1, 170.0, 200.0), _seg(2, 230.0, 260.0)]
    # attempt 0: a save after its last step, then the fault at 153; attempt 1: the fault at its last
    # step's end; attempt 2 ended without a fault; an onset before a segment's end is not its end
    onsets = [153.0, 200.0, 120.0]
    assert _training_s(segs, onsets) == pytest.approx(53.0 + 30.0 + 30.0)
    assert _training_s(segs, []) == pytest.approx(50.0 + 30.0 + 30.0)


@pytest.mark.parametrize("interval", [20.0, 0.30995249999999996, 0.30998349524999996, 0.1 + 0.2])
def test_a_failure_drawn_in_compute_is_never_moved_to_the_next_save(interval):
    """Only a failure drawn inside a save waits for its end. Intervals whose sums round differently
    (a fitted run's 0.30995 s, 0.1 + 0.2) once moved about half the failures drawn in compute too."""
    import numpy as np

    from stalwart.sim.cycles import fail_at, recovery
    from stalwart.sim.engine import _model
    from stalwart.sim.model import schedule

    cfg = _cfg(
        fail_in_save=False, tiers=[CheckpointTier(name="fs", interval_s=interval, stall_s=interval / 4)]
    )
    sch = schedule(cfg)
    m = _model(cfg, sch)
    rng = np.random.default_rng(3)
    e = rng.exponential(50 * sch.period_wall, size=(20, 30))
    cls = np.zeros(e.shape, dtype=np.int16)
    r_restart, r_restore, r_stall, _ = recovery(m, cls)
    rec = r_restart + r_restore + r_stall
    shift = fail_at(cfg, sch, m, e, cls) - (e + rec)
    into = e - np.floor(e / sch.period_wall) * sch.period_wall  # where in its period each was drawn
    in_compute = into < sch.base * (1 - 1e-9)
    assert in_compute.sum() > 100 and (~in_compute).sum() > 20
    assert np.all(shift[in_compute] == 0.0)
    # one drawn in a save waits for that save's end, never longer
    waited = shift[~in_compute]
    assert np.all(waited > 0) and np.all(waited <= interval / 4 + 1e-9)


def test_steady_slow_steps_take_their_share_of_training_and_nothing_else():
    plain = simulate(_cfg(trials=20))
    slow = simulate(_cfg(trials=20, slow_steps=0.25))
    trained = plain.buckets["productive"]
    # the same draws: only the split of the kept training time changes, 1.25 s of it per 1 s of work
    np.testing.assert_allclose(slow.buckets["productive"], trained / 1.25)
    np.testing.assert_allclose(slow.buckets["straggler_slowdown"], trained * 0.25 / 1.25)
    for bucket in ("lost_work", "detection", "restart", "checkpoint_stall"):
        np.testing.assert_allclose(slow.buckets[bucket], plain.buckets[bucket])
