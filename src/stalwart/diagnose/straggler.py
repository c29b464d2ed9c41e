"""Straggler scores per rank from per-step section timings (pure).

In data-parallel training a slow rank makes every other rank wait inside the gradient
all-reduce (the ``backward`` section), so total step time is the same on every rank. What
differs is the time spent outside the communication sections: a rank's *own work*. The score is
a rank's median own-work time over the fleet's median; a rank above ``threshold`` is a straggler.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from ..events import StepCompleted

COMM_SECTIONS = frozenset({"backward", "allreduce", "sync", "checkpoint"})


@dataclass(frozen=True)
class RankScore:
    rank: int
    own_work_s: float  # median per step
    score: float  # own work / fleet median own work
    straggler: bool


@dataclass(frozen=True)
class StragglerReport:
    ranks: tuple[RankScore, ...]
    fleet_median_s: float
    reason: str

    @property
    def stragglers(self) -> tuple[RankScore, ...]:
        return tuple(r for r in self.ranks if r.straggler)


def score_ranks(steps: Iterable[StepCompleted], threshold: float = 1.2, min_steps: int = 5) -> StragglerReport:
    own: dict[int, list[float]] = {}
    for s in steps:
        if not s.sections:
            continue
        comm = sum(v for k, v in s.sections.items() if k in COMM_SECTIONS)
        own.setdefault(s.rank, []).append(max(0.0, s.duration - comm))
    medians = {r: statistics.median(v) for r, v in own.items() if len(v) >= min_steps}
    if len(medians) < 2:
        return StragglerReport((), 0.0, "fewer than two ranks with section timings: no comparison")
    fleet = statistics.median(medians.values())
    scores = tuple(RankScore(r, m, m / fleet if fleet > 0 else 1.0, fleet > 0 and m / fleet > threshold)
                   for r, m in sorted(medians.items()))
    slow = [s for s in scores if s.straggler]
    if slow:
        worst = max(slow, key=lambda s: s.score)
        reason = (f"rank {worst.rank} spends {worst.own_work_s * 1e3:.1f} ms/step on its own work, "
                  f"{worst.score:.2f}x the fleet median {fleet * 1e3:.1f} ms (threshold {threshold:g}x)")
    else:
        reason = f"no rank above {threshold:g}x the fleet median own-work time {fleet * 1e3:.1f} ms"
    return StragglerReport(scores, fleet, reason)
