"""The pure policy that decides whether a run's failures are a failure rate (sim/evidence.py)."""

from __future__ import annotations

import pytest

from stalwart.sim.evidence import MAX_SPREAD, RateSource, judge_rates


def test_four_failures_are_the_fewest_that_pin_a_rate_down():
    assert judge_rates(4, 100.0).source is RateSource.MEASURED
    thin = judge_rates(3, 100.0)
    assert thin.source is RateSource.PUBLISHED
    assert "95% interval spans a factor of" in thin.reason and f"over {MAX_SPREAD:g}" in thin.reason


def test_the_spread_depends_on_the_count_not_on_the_exposure():
    # a rate's relative uncertainty is the count's: a longer run with as few failures is no surer
    for hours in (0.01, 1.0, 10_000.0):
        assert judge_rates(1, hours).source is RateSource.PUBLISHED
        assert judge_rates(20, hours).source is RateSource.MEASURED


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"injected": 2}, "2 fault(s) in this run were injected by chaos"),
        ({"marked_tests": True}, "marked as tests (--faults-are-tests)"),
    ],
)
def test_injected_or_marked_faults_are_never_a_rate_however_many(kw, words):
    d = judge_rates(50, 10.0, **kw)
    assert d.source is RateSource.PUBLISHED and words in d.reason


def test_no_failure_or_no_exposure_plans_with_published_rates():
    assert judge_rates(0, 10.0).source is RateSource.PUBLISHED
    assert "no infrastructure failure" in judge_rates(5, 0.0).reason


def test_a_stricter_spread_needs_more_failures():
    assert judge_rates(8, 5.0, max_spread=10.0).source is RateSource.MEASURED
    assert judge_rates(8, 5.0, max_spread=3.0).source is RateSource.PUBLISHED
