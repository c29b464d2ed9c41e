"""Straggler scores from per-step section timings (own work = step time outside comm sections)."""

from __future__ import annotations

import pytest

from stalwart.diagnose.straggler import score_ranks
from stalwart.events import StepCompleted


def step(rank: int, i: int, data: float, forward: float, backward: float) -> StepCompleted:
    return StepCompleted(
        ts=float(i),
        rank=rank,
        step=i,
        start=float(i),
        duration=data + forward + backward,
        sections={"data": data, "forward": forward, "backward": backward},
    )


def fleet(slow_rank: int | None = None, n_ranks: int = 4, n_steps: int = 8, slow_extra: float = 0.05):
    out = []
    for i in range(n_steps):
        for r in range(n_ranks):
            own_extra = slow_extra if r == slow_rank else 0.0
            # every rank's step takes 0.2 s: the others wait for the slow one inside backward (all-reduce)
            data, fwd = 0.02 + own_extra, 0.08
            out.append(step(r, i, data, fwd, 0.2 - data - fwd))
    return out


def test_slow_rank_is_flagged_with_its_ratio():
    rep = score_ranks(fleet(slow_rank=2), threshold=1.2)
    assert [s.rank for s in rep.ranks] == [0, 1, 2, 3]
    assert rep.fleet_median_s == pytest.approx(0.10)
    by = {s.rank: s for s in rep.ranks}
    assert by[2].own_work_s == pytest.approx(0.15) and by[2].score == pytest.approx(1.5)
    assert by[0].score == pytest.approx(1.0)
    assert [s.rank for s in rep.stragglers] == [2]
    assert rep.reason.startswith(
        "rank 2 spends 150.0 ms/step on its own work, 1.50x the fleet median 100.0 ms"
    )


def test_no_straggler_in_a_uniform_fleet():
    rep = score_ranks(fleet(), threshold=1.2)
    assert rep.stragglers == () and len(rep.ranks) == 4
    assert rep.reason.startswith("no rank above 1.2x")


def test_threshold_is_respected():
    assert score_ranks(fleet(slow_rank=1), threshold=1.6).stragglers == ()


def test_median_per_rank_ignores_one_slow_step():
    evs = fleet()
    evs.append(step(3, 99, 2.0, 0.08, 0.0))  # one checkpoint-sized hiccup on rank 3
    assert score_ranks(evs).stragglers == ()


def test_too_few_ranks_or_steps_or_sections():
    assert score_ranks([]).ranks == ()
    one = score_ranks(fleet(n_ranks=1))
    assert one.ranks == () and "fewer than two ranks" in one.reason
    assert score_ranks(fleet(slow_rank=0, n_steps=4), min_steps=5).ranks == ()
    bare = [
        StepCompleted(ts=0.0, rank=r, step=i, start=0.0, duration=1.0) for r in range(3) for i in range(6)
    ]
    assert score_ranks(bare).ranks == ()


def test_zero_own_work_does_not_divide_by_zero():
    evs = [
        StepCompleted(ts=0.0, rank=r, step=i, start=0.0, duration=0.1, sections={"backward": 0.1})
        for r in range(2)
        for i in range(5)
    ]
    rep = score_ranks(evs)
    assert rep.fleet_median_s == 0.0 and all(s.score == 1.0 and not s.straggler for s in rep.ranks)
