"""Whether a run's failures are evidence of a failure rate (one pure policy, used by ``stalwart plan``).

A run's failures set the fleet's failure rate only when they are real and numerous enough to pin a
rate down. Injected faults (chaos), faults the user marks as tests (``--faults-are-tests``, for a
``kill -9`` by hand), a run without failures and a run too short for its count (the exact 95% Poisson
interval of the rate spans more than ``MAX_SPREAD``) all plan with the published rates instead, and
say so. The run's measured times (detection, decision, restart, checkpoint stall) are used either way.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..policy.label import Label
from ..terminal import plural
from .fit import poisson_interval
from .units import number

# the widest ratio of the 95% interval's bounds that still counts as a measured rate: 4 failures
# (a factor of about 9.4) are the fewest that pass; 3 span about 14
MAX_SPREAD = 10.0


class RateSource(Label):
    """Where the planned failure rates come from."""

    MEASURED = "measured"  # the run's own failures
    PUBLISHED = "published"  # the default table (published fleet figures, docs/simulator.md)


@dataclass(frozen=True)
class RateEvidence:
    source: RateSource
    reason: str


def judge_rates(
    failures: int,
    gpu_hours: float,
    *,
    injected: int = 0,
    marked_tests: bool = False,
    max_spread: float = MAX_SPREAD,
) -> RateEvidence:
    """The rates to plan with for a run with ``failures`` infrastructure failures over ``gpu_hours``."""
    published = RateSource.PUBLISHED
    if marked_tests:
        return RateEvidence(
            published,
            f"the run's {plural(failures, 'failure')} {'is' if failures == 1 else 'are'} marked as tests (--faults-are-tests): published "
            "failure rates used, the run's measured times kept",
        )
    if injected:
        return RateEvidence(
            published,
            f"{injected} fault(s) in this run were injected by chaos, so its failure rate says nothing "
            "about a real fleet: published failure rates used, the run's measured times kept",
        )
    if failures <= 0 or gpu_hours <= 0:
        return RateEvidence(published, "no infrastructure failure in the run: published failure rates used")
    low, high = poisson_interval(failures, gpu_hours)
    spread = high / low if low > 0 else float("inf")
    if spread > max_spread:
        return RateEvidence(
            published,
            f"{plural(failures, 'failure')} in {number(gpu_hours)} GPU-hours is too little to estimate a rate "
            f"(its 95% interval spans a factor of {number(spread)}, over {max_spread:g}): published "
            "failure rates used, the run's measured times kept; mark a hand-made kill with "
            "--faults-are-tests to say so outright",
        )
    return RateEvidence(
        RateSource.MEASURED,
        f"{failures} failures in {number(gpu_hours)} GPU-hours (95% interval within a factor of "
        f"{number(spread)}): the run's own failure rate",
    )
