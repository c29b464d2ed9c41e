"""The fast paths of the all-trials-waiting case agree with the straightforward ones: the waits of a
job that never shrinks (loss by loss, a running maximum per ``spares + 1`` losses, pieces never
concatenated) with the cycle-by-cycle walk of the repair queue; the cheap test of which trials wait
with the vectorised window; a booking cut at the horizon with one over every drawn cycle."""

from __future__ import annotations

import numpy as np
import pytest

from stalwart.sim import SimConfig
from stalwart.sim.book import Draws, book
from stalwart.sim.config import FailureClass
from stalwart.sim.cycles import draw, shares, waits_for_repair
from stalwart.sim.engine import _cycles, _model, _schedule
from stalwart.sim.repair_queue import Piece, fixed_waits_of, repair_queue, sequential_waits

# (gpus, days, spares, repair hours, trials): no spare, a few, many with long repairs, a 100k-GPU year
CONFIGS = [
    (800, 20.0, 0, 12.0, 7),
    (4096, 30.0, 1, 48.0, 9),
    (16384, 54.0, 4, 48.0, 13),
    (16384, 54.0, 40, 400.0, 5),
    (100_000, 365.0, 64, 48.0, 3),
]


def _drawn(gpus: float, days: float, spares: int, repair_h: float, trials: int, seed: int, **kw: object):
    cfg = SimConfig(
        gpus=gpus, days=days, trials=trials, seed=seed, spare_nodes=spares, repair_hours=repair_h, **kw
    )
    m = _model(cfg, _schedule(cfg))
    k = _cycles(m.lam, cfg.horizon_s)
    rng = np.random.default_rng(seed)
    e, cls = draw(m, rng, trials, k)
    det = m.detect[cls]
    end = np.cumsum(e + det, axis=1, dtype=np.float64)
    assert (end[:, -1] >= cfg.horizon_s).all()
    return cfg, m, e, cls, det, end


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("config", CONFIGS)
def test_loss_by_loss_waits_equal_the_cycle_by_cycle_walk(config, seed):
    cfg, m, e, cls, det, end = _drawn(*config, seed=seed)
    spares, lost = cfg.spare_nodes or 0, m.node_loss[cls]
    walked, _ = sequential_waits(m.sizer, m.repair_s, spares, cfg.horizon_s, e, det, lost, end, by_loss=False)
    assert walked.any()  # these jobs do wait
    # in pieces of uneven sizes (as the second pass hands them over) and as one array
    cuts = [0, 1, 3, len(e)] if len(e) > 3 else [0, len(e)]
    pieces = [Piece(e[a:b], det[a:b], lost[a:b], end[a:b]) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    fast = np.concatenate(fixed_waits_of(m.repair_s, spares, cfg.horizon_s, pieces))
    before = e < cfg.horizon_s - np.concatenate(
        [np.zeros((len(e), 1)), np.cumsum(e + det + walked, axis=1)[:, :-1]], axis=1
    )
    np.testing.assert_allclose(fast[before], walked[before], rtol=0, atol=1e-6 * m.repair_s)
    assert not fast[~before].any() and not walked[~before].any()  # after the horizon nobody waits


# some trials wait and some do not
BORDERLINE = [(16384, 20.0, 20, 48.0, 24), (16384, 20.0, 24, 48.0, 48), (4096, 30.0, 8, 48.0, 24)]


def test_a_piece_longer_than_a_block_and_a_whole_engine_run_where_every_trial_waits():
    from stalwart.sim import simulate
    from stalwart.sim.repair_queue import STEP_CELLS

    # 40 spares: blocks of 200 trials; pieces of 250 and 3 trials
    cfg, m, e, cls, det, end = _drawn(16384, 54.0, 40, 400.0, 253, seed=6)
    assert STEP_CELLS // 41 < 250
    lost = m.node_loss[cls]
    pieces = [
        Piece(e[:250], det[:250], lost[:250], end[:250]),
        Piece(e[250:], det[250:], lost[250:], end[250:]),
    ]
    fast = fixed_waits_of(m.repair_s, 40, cfg.horizon_s, pieces)
    assert [len(w) for w in fast] == [250, 3]
    walked, _ = sequential_waits(m.sizer, m.repair_s, 40, cfg.horizon_s, e, det, lost, end, by_loss=False)
    np.testing.assert_allclose(np.concatenate(fast), walked, rtol=0, atol=1e-6 * m.repair_s)
    # the engine's chunks hold more trials than a block here, and every trial waits
    r = simulate(SimConfig(gpus=16384, days=54.0, trials=600, seed=6, spare_nodes=40, repair_hours=400.0))
    assert r.iterations == 2 and (r.buckets["wait_nodes"] > 0).all()


@pytest.mark.parametrize("seed", [3, 4])
@pytest.mark.parametrize("config", CONFIGS + BORDERLINE)
def test_which_trials_wait_is_the_vectorised_windows_answer(config, seed):
    gpus, days, spares, repair_h, _ = config
    cfg, m, e, cls, det, end = _drawn(gpus, days, spares, repair_h, max(24, config[-1]), seed)
    _, must = shares(cfg, m, e, det, cls, end)  # the job never shrinks: the trial-by-trial test
    lost = m.node_loss[cls]
    flat = np.flatnonzero(lost)
    starts = np.concatenate([np.zeros((len(e), 1)), end[:, :-1]], axis=1).ravel()[flat]
    flat = flat[e.ravel()[flat] < cfg.horizon_s - starts]
    window, _, _ = repair_queue(m.sizer, m.repair_s, spares, end.ravel()[flat], flat // e.shape[1], len(e))
    np.testing.assert_array_equal(must, window)
    np.testing.assert_array_equal(must, waits_for_repair(cfg.horizon_s, m.repair_s, spares, e, lost, end))
    if config in BORDERLINE:
        assert must.any() and not must.all()
    elif spares <= 4:
        assert must.all()


@pytest.mark.parametrize(
    "extra",
    [
        {},
        dict(straggler_per_node_day=0.02, straggler_slowdown=0.3),  # the stream of the straggler draws
        dict(max_restarts=3, strategy="requeue"),
        dict(failures=[FailureClass(name="gpu", per_1000_gpu_days=3.0, detect_s=40.0)], step_s=2.0),
    ],
)
def test_booking_up_to_the_horizon_equals_booking_every_drawn_cycle(extra):
    cfg, m, e, cls, det, end = _drawn(4096, 30.0, 1, 48.0, 11, seed=5, **extra)
    wait, _ = sequential_waits(
        m.sizer, m.repair_s, cfg.spare_nodes or 0, cfg.horizon_s, e, det, m.node_loss[cls], end
    )
    d = Draws(e, det, cls, wait, None, None)
    sch = _schedule(cfg)
    cut = book(cfg, sch, m, np.random.default_rng(9), d, True)
    full = book(cfg, sch, m, np.random.default_rng(9), d, True, trim=False)
    np.testing.assert_array_equal(cut[1], full[1])  # every failure counted in the same class
    for name, value in full[0].items():
        np.testing.assert_allclose(cut[0][name], value, rtol=1e-12, atol=1e-6, err_msg=name)
    assert cut[2] == full[2]  # the trace of trial 0
    assert full[0]["wait_nodes"].any()
