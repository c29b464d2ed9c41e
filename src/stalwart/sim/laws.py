"""How each recovery cost grows with the job, and where every figure comes from.

A :class:`Law` holds the figures known for one phase (measured by Stalwart at a few world sizes, or
published for a GPU cluster at one size) and says how the phase grows between and beyond them:

* ``CONSTANT``: it does not grow with the job (each node does it in parallel: a process exit, a fork,
  an import, a CUDA context); a measured figure is used as it is, at every size;
* ``RANKS``: it grows linearly with the number of ranks (a store every rank checks in with, a
  communicator's bootstrap); the figures are joined by straight lines in ranks, and beyond the
  largest one the line runs on with the slope of the last two;
* ``LOG_RANKS``: the same in log2(ranks) (a tree or ring of log depth).

The value is monotone in ranks: the figures are taken as a running maximum over size (a smaller
figure at a larger size, e.g. a published GPU figure below a 2-core CPU measurement, holds the
larger one constant there and says so). At a size where a figure was measured or published it is
that figure. A law with one figure and a growth other than ``CONSTANT`` covers only that size:
:meth:`Law.at` refuses any other size with :class:`NoLaw` (a small run's time is never presented
as a large job's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ConfigError
from ..policy.label import Label


class Source(Label):
    """Where a figure came from."""

    MEASURED = "measured"  # by Stalwart, in a run's ledger or a benchmark
    FITTED = "fitted"  # a law through measured (and published) figures, at a size none was taken at
    PUBLISHED = "published"  # a GPU-cluster figure from a paper or vendor (docs/simulator.md cites it)
    DEFAULT = "default"  # an assumption of ours, stated where it is used
    DERIVED = "derived"  # computed from the target job's description (bytes / bandwidth, FLOPs)
    GIVEN = "given"  # set by the user (a flag or the config file)


class Growth(Label):
    CONSTANT = "constant"
    RANKS = "ranks"
    LOG_RANKS = "log_ranks"


class NoLaw(ConfigError):
    """A figure taken at one size was asked for at another, and nothing says how it grows."""


@dataclass(frozen=True)
class Point:
    """One known figure: ``value`` seconds at ``ranks`` ranks."""

    ranks: int
    value: float
    source: Source
    cite: str  # "4-rank CPU run (ledger)", "NCCLX, arXiv 2510.20171"


@dataclass(frozen=True)
class Figure:
    """A number with its origin, ready to print: ``value`` seconds and why."""

    value: float
    source: Source
    note: str


def _x(ranks: float, growth: Growth) -> float:
    if growth is Growth.LOG_RANKS:
        return math.log2(max(ranks, 1.0))
    return float(ranks)


@dataclass(frozen=True)
class Law:
    """The figures known for one phase and how it grows between and beyond them."""

    phase: str
    growth: Growth
    points: tuple[Point, ...]

    def __post_init__(self) -> None:
        if not self.points:
            raise ConfigError(f"phase {self.phase}: a law needs at least one figure")
        for p in self.points:
            if not (p.ranks >= 1 and math.isfinite(p.value) and p.value >= 0):
                raise ConfigError(
                    f"phase {self.phase}: figure {p.value!r} s at {p.ranks} ranks is not a time",
                    "figures are non-negative seconds at a positive number of ranks",
                )

    def _knots(self) -> list[tuple[float, float, Point]]:
        """(x, running-max value, point) by size; at one size the measured figure wins."""
        return [(x, v, p) for x, v, p, _ in self._knots_with_setter()]

    def _knots_with_setter(self) -> list[tuple[float, float, Point, Point]]:
        """As :meth:`_knots`, with the point whose figure the running maximum holds."""
        by_size: dict[int, Point] = {}
        for p in sorted(self.points, key=lambda p: (p.ranks, p.source is Source.MEASURED)):
            by_size[p.ranks] = p
        knots: list[tuple[float, float, Point, Point]] = []
        top, setter = -1.0, None
        for ranks in sorted(by_size):
            if by_size[ranks].value >= top:  # a tie: the figure at this size stands for itself
                top, setter = by_size[ranks].value, by_size[ranks]
            assert setter is not None
            knots.append((_x(ranks, self.growth), top, by_size[ranks], setter))
        return knots

    def at(self, ranks: int) -> Figure:
        """The phase's seconds at ``ranks`` ranks, with where the figure came from."""
        if ranks < 1:
            raise ConfigError(f"phase {self.phase}: {ranks} ranks")
        knots = self._knots()
        if self.growth is Growth.CONSTANT:
            _, value, p = knots[-1]
            how = "does not grow with the job" if p.ranks != ranks else "at this size"
            return Figure(value, p.source, f"{p.cite} at {p.ranks:,} ranks ({how})")
        for _, value, p, setter in self._knots_with_setter():
            if p.ranks == ranks:
                if setter is p:
                    return Figure(value, p.source, f"{p.cite} at {p.ranks:,} ranks: {p.value:.3g} s")
                return Figure(
                    value,
                    setter.source,
                    f"held at {value:.3g} s, {setter.source} at {setter.ranks:,} ranks ({setter.cite}), "
                    f"above the {p.value:.3g} s {p.source} at {p.ranks:,} ({p.cite})",
                )
        if len(knots) == 1:
            p = knots[0][2]
            raise NoLaw(
                f"{self.phase}: {p.value:g} s was {p.source} at {p.ranks:,} ranks and grows with the "
                f"{self.growth.value.replace('_', ' ')}; no law says what it is at {ranks:,}",
                "give a published figure at scale or measurements at several world sizes",
            )
        x = _x(ranks, self.growth)
        if x <= knots[0][0]:
            _, value, p = knots[0]
            return Figure(value, p.source, f"{p.cite} at {p.ranks:,} ranks (held below it)")
        i = next((k for k in range(1, len(knots)) if x <= knots[k][0]), len(knots) - 1)
        (x0, v0, p0), (x1, v1, p1) = knots[i - 1], knots[i]
        slope = (v1 - v0) / (x1 - x0) if x1 > x0 else 0.0
        value = v0 + slope * (x - x0)
        how = "between" if x <= x1 else "beyond"
        per = "log2(ranks)" if self.growth is Growth.LOG_RANKS else "ranks"
        return Figure(
            max(value, 0.0),
            Source.FITTED,
            f"linear in {per} {how} {p0.source} {p0.value:.3g} s at {p0.ranks:,} ({p0.cite}) and "
            f"{p1.source} {p1.value:.3g} s at {p1.ranks:,} ({p1.cite})",
        )
