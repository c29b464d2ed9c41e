"""Watching the watchers: a collector or detector that stopped reporting is itself an incident.

A silent NVML collector looks exactly like a healthy GPU. Each watched source declares how often it
reports; when its last report is older than ``expected_interval_s x k`` (or it never reported
within that time of being started), :func:`silent_watchers` returns an incident naming it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import ConfigError
from .incident import BlastRadius, Component, FaultClass, Incident


@dataclass(frozen=True)
class Watched:
    name: str  # e.g. "nvml collector", "straggler detector", "kernel-log reader"
    node: str
    expected_interval_s: float
    started: float  # when it was started (a source that never reported is judged from here)
    last_report: float | None = None

    def __post_init__(self) -> None:
        if not self.expected_interval_s > 0:
            raise ConfigError(f"{self.name}: expected interval must be > 0, got {self.expected_interval_s!r}")


def silent_watchers(sources: Iterable[Watched], now: float, k: float = 3.0) -> tuple[Incident, ...]:
    """One incident per source silent for more than ``k`` expected intervals."""
    if k < 1:
        raise ConfigError(f"the silence factor k must be >= 1, got {k}")
    out = []
    for s in sources:
        since = s.last_report if s.last_report is not None else s.started
        silent = now - since
        limit = k * s.expected_interval_s
        if silent <= limit:
            continue
        what = "last reported" if s.last_report is not None else "has not reported since it started"
        out.append(
            Incident(
                cause=(
                    f"{s.name} on {s.node} is silent: {what} {silent:.0f} s ago, expected every "
                    f"{s.expected_interval_s:g} s; what it watches is unobserved"
                ),
                fault_class=FaultClass.SYSTEM,
                component=Component.COLLECTOR,
                confidence=round(min(0.99, 0.5 + 0.1 * silent / s.expected_interval_s), 4),
                action="restart_collector_and_alert",
                ts=now,
                onset=since + s.expected_interval_s,
                rule="policy:silent-watcher",
                evidence=(f"{s.name}@{s.node}: silent {silent:.0f} s > {k:g} x {s.expected_interval_s:g} s",),
                blast_radius=BlastRadius(nodes=(s.node,)),
            )
        )
    return tuple(out)
