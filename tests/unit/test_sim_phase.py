"""The checkpoint schedule's phase carried across recoveries that keep the progress (sim/phase.py),
against a walk of each trial written out one save at a time, and on the cases that tell it from
booking every run phase from phase 0."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stalwart.sim import CheckpointTier, SimConfig
from stalwart.sim.cycles import run_split
from stalwart.sim.model import schedule
from stalwart.sim.phase import Split, carried

BASE, STALL = 100.0, 10.0


def _sch(persist: float = 0.0):
    tier = CheckpointTier(name="ram", interval_s=BASE, stall_s=STALL, restore_s=0.0, persist_s=persist)
    return schedule(SimConfig(tiers=[tier]))


def _walk(x: float, progress: float, persist: float) -> tuple[float, int, float, float]:
    """One run phase of ``x`` wall seconds from ``progress``, one save at a time: (compute, saves
    done, their stall, the position of the newest save whose persist finished; -1 if none)."""
    left, pos, saves, stall, newest, wall = x, progress, 0, 0.0, -1.0, 0.0
    while True:
        on = abs(pos / BASE - round(pos / BASE)) < 1e-9
        gap = BASE if on else (math.floor(pos / BASE) + 1) * BASE - pos
        if left < gap:
            return pos + left - progress, saves, stall, newest
        pos, left, wall = pos + gap, left - gap, wall + gap
        pos = round(pos / BASE) * BASE
        if left < STALL:  # the save is cut short: it never happened
            return pos - progress, saves, stall, newest
        left, wall, saves, stall = left - STALL, wall + STALL, saves + 1, stall + STALL
        if wall + persist <= x:
            newest = pos


def _reference(x: np.ndarray, keeps: np.ndarray, rolls: np.ndarray, persist: float) -> Split:
    """Each trial walked cycle by cycle: the progress, counted from the checkpoint the job last
    resumed at, carries over a cycle that keeps it and goes back to the newest committed save on a
    rollback; any other cycle's successor starts at that checkpoint again."""
    out = Split(*(np.zeros_like(x) for _ in range(4)))
    for i in range(x.shape[0]):
        progress, newest = 0.0, 0.0
        for c in range(x.shape[1]):
            comp, saves, stall, at = _walk(float(x[i, c]), progress, persist)
            if at >= 0:
                newest = at
            out.compute[i, c], out.n_ckpt[i, c], out.stalled[i, c] = comp, saves, stall
            if keeps[i, c]:
                out.kept[i, c], progress = comp, progress + comp
            else:
                after = newest if rolls[i, c] else progress + comp
                out.kept[i, c] = after - progress
                progress, newest = 0.0, 0.0
    return out


@pytest.mark.parametrize("persist", [0.0, 25.0])
def test_carried_agrees_with_a_walk_of_each_save(persist):
    sch = _sch(persist)
    rng = np.random.default_rng(5)
    x = rng.exponential(0.8 * BASE, (40, 25))
    draw = rng.random((40, 25))
    keeps, rolls = draw < 0.6, draw >= 0.75  # the rest: a planned stop, whose checkpoint holds it all
    compute, n_ckpt, stalled = run_split(sch, x)
    at_zero = Split(compute, n_ckpt, stalled, np.where(rolls, 0.0, compute))
    got = carried(sch, x, keeps, rolls, np.zeros_like(keeps), at_zero)
    want = _reference(x, keeps, rolls, persist)
    # the cycles outside any chain (every cycle from phase 0) are the reference's too, rollbacks aside
    outside = ~keeps
    outside[:, 1:] &= ~keeps[:, :-1]
    want.kept[outside & rolls] = at_zero.kept[outside & rolls]
    got.kept[outside & rolls] = at_zero.kept[outside & rolls]
    for name in ("compute", "n_ckpt", "stalled", "kept"):
        np.testing.assert_allclose(getattr(got, name), getattr(want, name), atol=1e-6, err_msg=name)
    assert (got.kept < 0).any()  # some rollback lost what earlier in-place cycles had kept


def test_in_place_recoveries_shorter_than_the_interval_still_save_on_schedule():
    """Eight in-place recoveries 55 s of compute apart: from phase 0 each run phase would end before
    its first save; carried, the progress reaches a multiple of the interval every other cycle."""
    sch = _sch()
    x = np.full((1, 8), 55.0)
    x[0, 1::2] += STALL  # the cycles that save also stall
    keeps, rolls = np.ones_like(x, dtype=bool), np.zeros_like(x, dtype=bool)
    compute, n_ckpt, stalled = run_split(sch, x)
    assert n_ckpt.sum() == 0
    got = carried(sch, x, keeps, rolls, rolls, Split(compute, n_ckpt, stalled, compute))
    assert got.n_ckpt.tolist() == [[0, 1, 0, 1, 0, 1, 0, 1]]
    assert got.compute.sum() == pytest.approx(440.0) and got.stalled.sum() == pytest.approx(4 * STALL)
    assert got.kept.sum() == pytest.approx(440.0)


def test_a_rollback_after_in_place_recoveries_returns_to_the_newest_committed_save():
    """150 s kept in place (a save at 100), then 30 s and a rollback: back to 100, so the rollback's
    cycle loses its own 30 s and the 50 s the first cycle kept after the save. With a persist longer
    than the time left after the save, that save never committed: back to the start, losing 150 s."""
    x = np.array([[150.0 + STALL, 30.0]])
    keeps, rolls = np.array([[True, False]]), np.array([[False, True]])
    for persist, kept in ((0.0, -50.0), (55.0, -150.0)):
        sch = _sch(persist)
        compute, n_ckpt, stalled = run_split(sch, x)
        at_zero = Split(compute, n_ckpt, stalled, np.where(rolls, 0.0, compute))
        got = carried(sch, x, keeps, rolls, np.zeros_like(keeps), at_zero)
        assert got.kept.ravel().tolist() == pytest.approx([150.0, kept])
        assert got.compute.ravel().tolist() == pytest.approx([150.0, 30.0])


def test_a_node_loss_rolls_back_to_the_newest_save_that_survives_it():
    """Two tiers: memory every 100 s, disk every 300 s. After 450 s in place the memory save at 400 is
    the newest, the disk one at 300 the newest that survives a node loss."""
    tiers = [
        CheckpointTier(name="ram", interval_s=BASE, stall_s=STALL, restore_s=0.0, survives_node_loss=False),
        CheckpointTier(name="disk", interval_s=3 * BASE, stall_s=STALL, restore_s=0.0),
    ]
    sch = schedule(SimConfig(tiers=tiers))
    x = np.array([[450.0 + 5 * STALL, 10.0], [450.0 + 5 * STALL, 10.0]])
    keeps = np.array([[True, False], [True, False]])
    rolls = ~keeps
    lost = np.array([[False, False], [False, True]])
    compute, n_ckpt, stalled = run_split(sch, x)
    got = carried(sch, x, keeps, rolls, lost, Split(compute, n_ckpt, stalled, compute))
    assert got.n_ckpt[:, 0].tolist() == [4, 4]
    assert got.kept[:, 1].tolist() == pytest.approx([400.0 - 450.0, 300.0 - 450.0])
