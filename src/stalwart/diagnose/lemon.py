"""Lemon nodes: nodes that fail far more often than the fleet (moved here from account/reliability.py).

A node's failure count is compared with a Poisson distribution whose mean is the fleet's rate times
that node's exposure; the score is the upper-tail probability ``P(X >= k)``. A node is a lemon when
that probability is below ``alpha / number_of_nodes`` (Bonferroni) and it failed at least
``min_failures`` times. :func:`lemon_incidents` turns lemons into incidents (quarantine, RMA review).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import ConfigError
from .incident import BlastRadius, Component, FaultClass, Incident


def poisson_sf(k: int, mu: float) -> float:
    """P(X >= k) for X ~ Poisson(mu), summed exactly (k small, as here)."""
    if k <= 0:
        return 1.0
    if mu <= 0:
        return 0.0
    term = math.exp(-mu)
    cdf = term
    for j in range(1, k):
        term *= mu / j
        cdf += term
    return max(0.0, 1.0 - cdf)


@dataclass(frozen=True)
class NodeScore:
    node: str
    failures: int
    node_days: float
    expected: float
    ratio: float  # failures / expected
    p_value: float  # P(X >= failures) under the fleet rate
    lemon: bool
    reason: str


def lemon_scores(
    failures_by_node: Mapping[str, int],
    node_days: Mapping[str, float],
    *,
    alpha: float = 0.01,
    min_failures: int = 2,
) -> list[NodeScore]:
    """Score every node against the fleet rate (Poisson upper tail, Bonferroni over the nodes)."""
    if not node_days:
        raise ConfigError("no node exposure given", "lemon scoring needs node-days for every node")
    for node, d in node_days.items():
        if not (d >= 0 and math.isfinite(d)):
            raise ConfigError(f"node-days of {node} must be non-negative, got {d!r}")
    unknown = set(failures_by_node) - set(node_days)
    if unknown:
        raise ConfigError(
            f"failures on nodes without exposure: {', '.join(sorted(unknown))}",
            "pass node-days for every node that failed",
        )
    total_days = sum(node_days.values())
    if total_days <= 0:
        raise ConfigError("total node-days is zero")
    rate = sum(failures_by_node.values()) / total_days
    threshold = alpha / len(node_days)
    out = []
    for node, days in node_days.items():
        k = int(failures_by_node.get(node, 0))
        mu = rate * days
        p = poisson_sf(k, mu)
        lemon = k >= min_failures and p < threshold
        ratio = k / mu if mu > 0 else (math.inf if k else 0.0)
        reason = (
            f"{node}: {k} failures in {days:.1f} node-days, fleet rate predicts {mu:.2f}; "
            f"P(>= {k}) = {p:.2e} {'<' if p < threshold else '>='} {threshold:.1e} (alpha/nodes)"
        )
        out.append(NodeScore(node, k, days, mu, ratio, p, lemon, reason))
    out.sort(key=lambda s: (s.p_value, -s.failures))
    return out


def lemon_incidents(scores: list[NodeScore], now: float) -> tuple[Incident, ...]:
    """One hardware incident per lemon: quarantine it and review it for RMA."""
    out = []
    for s in scores:
        if not s.lemon:
            continue
        conf = round(min(0.99, 1.0 - s.p_value), 4)
        out.append(
            Incident(
                cause=f"lemon node {s.node}: {s.failures} failures where the fleet rate predicts {s.expected:.2f}",
                fault_class=FaultClass.HARDWARE,
                component=Component.UNKNOWN,
                confidence=conf,
                action="quarantine_rma_review",
                ts=now,
                onset=now,
                rule="policy:lemon-node",
                evidence=(s.reason,),
                blast_radius=BlastRadius(nodes=(s.node,)),
            )
        )
    return tuple(out)
