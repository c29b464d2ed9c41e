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

from ..errors import ConfigError
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


def score_ranks(
    steps: Iterable[StepCompleted], threshold: float = 1.2, min_steps: int = 5
) -> StragglerReport:
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
    scores = tuple(
        RankScore(r, m, m / fleet if fleet > 0 else 1.0, fleet > 0 and m / fleet > threshold)
        for r, m in sorted(medians.items())
    )
    slow = [s for s in scores if s.straggler]
    if slow:
        worst = max(slow, key=lambda s: s.score)
        reason = (
            f"rank {worst.rank} spends {worst.own_work_s * 1e3:.1f} ms/step on its own work, "
            f"{worst.score:.2f}x the fleet median {fleet * 1e3:.1f} ms (threshold {threshold:g}x)"
        )
    else:
        reason = f"no rank above {threshold:g}x the fleet median own-work time {fleet * 1e3:.1f} ms"
    return StragglerReport(scores, fleet, reason)


@dataclass(frozen=True)
class SlowSpan:
    rank: int
    first_step: int
    last_step: int
    score: float  # the highest window score in the span


def slow_spans(
    steps: Iterable[StepCompleted], window: int = 20, threshold: float = 1.2
) -> tuple[SlowSpan, ...]:
    """Stretches of steps in which a rank was a straggler, from consecutive windows of ``window`` steps.

    A whole-run median hides a rank that was slow for a while; scoring each window does not."""
    by_window: dict[int, list[StepCompleted]] = {}
    for s in steps:
        by_window.setdefault(s.step // window, []).append(s)
    flagged: dict[int, list[tuple[int, float]]] = {}
    for w in sorted(by_window):
        rep = score_ranks(by_window[w], threshold, min_steps=max(3, window // 4))
        for r in rep.stragglers:
            flagged.setdefault(r.rank, []).append((w, r.score))
    spans = []
    for rank, wins in flagged.items():
        start, prev, best = wins[0][0], wins[0][0], wins[0][1]
        tail: list[tuple[int | None, float]] = [*wins[1:], (None, 0.0)]  # None: close the last span
        for nxt, score in tail:
            if nxt is not None and nxt == prev + 1:
                prev, best = nxt, max(best, score)
                continue
            spans.append(SlowSpan(rank, start * window, (prev + 1) * window - 1, best))
            if nxt is not None:
                start, prev, best = nxt, nxt, score
    return tuple(sorted(spans, key=lambda sp: (sp.first_step, sp.rank)))


# --- per-step relative detection with debounce (holds under machine-wide load) -------------------


@dataclass(frozen=True)
class RelativeStraggler:
    rank: int
    ratio: float  # median of its flagged windows' scores (own work / that step's median)
    flagged: int  # windows over the threshold among the last ``n`` seen
    seen: int
    first_step: int  # first step of the earliest flagged window among the last ``n``


@dataclass(frozen=True)
class RelativeReport:
    stragglers: tuple[RelativeStraggler, ...]
    windows: int  # windows with enough ranks to compare
    reason: str


def own_work(s: StepCompleted) -> float:
    if not s.sections:
        return s.duration
    comm = sum(v for k, v in s.sections.items() if k in COMM_SECTIONS)
    return max(0.0, s.duration - comm)


def relative_stragglers(
    steps: Iterable[StepCompleted],
    *,
    threshold: float = 1.2,
    window: int = 10,
    k: int = 3,
    n: int = 5,
    min_ranks: int = 3,
) -> RelativeReport:
    """Stragglers from per-step relative times, debounced: ``k`` of the last ``n`` windows must agree.

    Every rank's own-work time at step ``s`` is divided by the median over the ranks at that same
    step, so a slowdown that hits the whole machine (all ranks slower together: I/O, a noisy
    neighbour, a checkpoint) cancels out. A window's score is the rank's median ratio over its steps;
    a rank is a straggler when its score exceeds ``threshold`` in at least ``k`` of the last ``n``
    windows, so one slow window (a hiccup) does not flag it.
    """
    if not (1 <= k <= n) or window < 1 or min_ranks < 2:
        raise ConfigError(
            f"straggler debounce needs 1 <= k <= n, window >= 1, min_ranks >= 2 "
            f"(got k={k}, n={n}, window={window}, min_ranks={min_ranks})"
        )
    by_step: dict[int, dict[int, float]] = {}
    for s in steps:
        by_step.setdefault(s.step, {})[s.rank] = own_work(s)
    ratios: dict[int, dict[int, list[float]]] = {}  # window -> rank -> ratios
    for step, per_rank in by_step.items():
        if len(per_rank) < min_ranks:
            continue
        med = statistics.median(per_rank.values())
        if med <= 0:
            continue
        for r, t in per_rank.items():
            ratios.setdefault(step // window, {}).setdefault(r, []).append(t / med)
    need = max(1, window // 2)
    scored = sorted(w for w, per in ratios.items() if any(len(v) >= need for v in per.values()))
    last = scored[-n:]
    flags: dict[int, list[tuple[int, float]]] = {}
    for w in last:
        for r, vals in ratios[w].items():
            if len(vals) >= need:
                score = statistics.median(vals)
                if score > threshold:
                    flags.setdefault(r, []).append((w, score))
    out = tuple(
        RelativeStraggler(r, statistics.median(sc for _, sc in f), len(f), len(last), f[0][0] * window)
        for r, f in sorted(flags.items())
        if len(f) >= k
    )
    if not last:
        return RelativeReport((), 0, f"fewer than {min_ranks} ranks per step: no comparison")
    if out:
        worst = max(out, key=lambda s: s.ratio)
        reason = (
            f"rank {worst.rank} is {worst.ratio:.2f}x the per-step median in {worst.flagged} of the last "
            f"{worst.seen} windows of {window} steps (needs {k}; threshold {threshold:g}x)"
        )
    else:
        reason = (
            f"no rank above {threshold:g}x the per-step median in {k} of the last {len(last)} windows "
            f"of {window} steps"
        )
    return RelativeReport(out, len(last), reason)
