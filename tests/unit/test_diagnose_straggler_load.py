"""Per-step relative straggler detection with k-of-n debounce: holds under machine-wide noise."""

from __future__ import annotations

import random

import pytest

from stalwart.diagnose.straggler import relative_stragglers, score_ranks
from stalwart.errors import ConfigError
from stalwart.events import StepCompleted


def run(n_ranks=8, n_steps=100, slow=None, seed=1, noisy=True, hiccup=None):
    """Own work ~100 ms per rank with 3 % jitter. ``noisy``: at a third of the steps the whole machine
    is slowed together by 1.5-4x. ``slow``: (rank, factor, from_step). ``hiccup``: (rank, factor, steps)."""
    rnd = random.Random(seed)
    out = []
    for i in range(n_steps):
        machine = rnd.uniform(1.5, 4.0) if noisy and rnd.random() < 0.33 else 1.0
        own = {}
        for r in range(n_ranks):
            t = 0.1 * machine * rnd.uniform(0.97, 1.03)
            if slow and r == slow[0] and i >= slow[2]:
                t *= slow[1]
            if hiccup and r == hiccup[0] and i in hiccup[2]:
                t *= hiccup[1]
            own[r] = t
        step_time = max(own.values()) + 0.02  # everybody waits for the slowest inside the all-reduce
        for r in range(n_ranks):
            out.append(
                StepCompleted(
                    ts=float(i),
                    rank=r,
                    step=i,
                    start=float(i),
                    duration=step_time,
                    sections={"forward": own[r], "backward": step_time - own[r]},
                )
            )
    return out


@pytest.mark.parametrize("seed", range(5))
def test_machine_wide_noise_raises_no_straggler(seed):
    rep = relative_stragglers(run(seed=seed), threshold=1.2, window=10, k=3, n=5)
    assert rep.stragglers == () and rep.windows == 5
    assert rep.reason.startswith("no rank above 1.2x")


def test_a_real_straggler_is_found_under_the_same_noise():
    rep = relative_stragglers(run(slow=(3, 1.5, 40)), threshold=1.2, window=10, k=3, n=5)
    assert [s.rank for s in rep.stragglers] == [3]
    s = rep.stragglers[0]
    assert s.ratio == pytest.approx(1.5, rel=0.05) and s.flagged == 5 and s.first_step == 50
    assert rep.reason.startswith("rank 3 is 1.5")


def test_one_slow_window_is_debounced_but_three_are_not():
    one = relative_stragglers(run(hiccup=(2, 2.0, set(range(60, 70)))), window=10, k=3, n=5)
    assert one.stragglers == ()
    three = relative_stragglers(run(hiccup=(2, 2.0, set(range(50, 80)))), window=10, k=3, n=5)
    assert [s.rank for s in three.stragglers] == [2] and three.stragglers[0].flagged == 3


def test_a_straggler_that_recovered_long_ago_is_not_current():
    rep = relative_stragglers(run(hiccup=(1, 2.0, set(range(0, 40)))), window=10, k=3, n=5)
    assert rep.stragglers == ()


def test_score_ranks_still_works_next_to_it():
    assert [s.rank for s in score_ranks(run(slow=(3, 1.5, 0), noisy=False)).stragglers] == [3]


def test_too_few_ranks_and_bad_parameters():
    assert relative_stragglers(run(n_ranks=2), min_ranks=3).stragglers == ()
    assert "fewer than 3 ranks" in relative_stragglers(run(n_ranks=2), min_ranks=3).reason
    with pytest.raises(ConfigError, match="1 <= k <= n"):
        relative_stragglers([], k=6, n=5)
