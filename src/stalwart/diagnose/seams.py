"""Seams: causes that sit between a node and the facility around it.

- :func:`cooling_seams`: a straggler whose GPU is in thermal slowdown, on a cooling loop whose inlet
  temperature rises (or flow falls, or a pump stops), is ONE facility incident per loop, with its cost,
  not an RMA per GPU. Without a facility trend it is a GPU-local cooling defect on that node.
- :func:`blast_radius`: several nodes failing within minutes under one leaf switch, PDU, cooling loop
  or rack is ONE shared-cause incident, and those nodes are held, not mass-drained. Independent
  faults are drained up to a cap.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from .facility import CoolingThresholds, FacilitySample, cooling_trend
from .incident import BlastRadius, Component, FaultClass, Incident, slowdown_cost_gpu_s
from .signals import Signal
from .topology import DOMAINS, Topology

THERMAL_CODES = frozenset({"gpu.clock.hw_thermal", "gpu.temp.slowdown", "gpu.clock.sw_thermal"})
_DOMAIN_COMPONENT = {
    "leaf_switch": Component.SWITCH,
    "pdu": Component.POWER,
    "cooling_loop": Component.COOLING,
    "rack": Component.UNKNOWN,
}


@dataclass(frozen=True)
class SlowRank:
    """A straggler as the detector saw it: ``slowdown`` = its step time over the fleet's (e.g. 1.4)."""

    node: str
    rank: int
    since: float  # when it became slow
    slowdown: float
    evidence: str = ""


class SeamConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    window_s: float = Field(
        default=900.0, gt=0, description="how far back thermal and facility signals count"
    )
    cooling: CoolingThresholds = CoolingThresholds()
    shared_window_s: float = Field(
        default=300.0, gt=0, description="faults this close in time may share a cause"
    )
    shared_min_nodes: int = Field(
        default=3, ge=2, description="nodes under one domain that make a shared cause"
    )
    max_drains: int = Field(default=2, ge=0, description="automatic drains allowed per decision")


def cooling_seams(
    slow: Sequence[SlowRank],
    signals: Iterable[Signal],
    facility: Iterable[FacilitySample],
    topology: Topology,
    now: float,
    *,
    gpus: int,
    cfg: SeamConfig | None = None,
) -> tuple[Incident, ...]:
    """One incident per degraded cooling loop (all its thermally slowed stragglers), plus one GPU-local
    cooling incident per thermally slowed straggler whose loop looks normal. Stragglers without a
    thermal signal on their node are left to other diagnoses."""
    c = cfg or SeamConfig()
    sigs = list(signals)
    fac = list(facility)
    thermal: dict[str, list[Signal]] = {}
    for s in sigs:
        if s.code in THERMAL_CODES and now - c.window_s <= s.ts <= now:
            thermal.setdefault(s.node, []).append(s)
    by_loop: dict[str, list[SlowRank]] = {}
    out: list[Incident] = []
    for sr in slow:
        if sr.node not in thermal:
            continue
        loop = topology.domain_of(sr.node, "cooling_loop")
        trend = cooling_trend(fac, loop, min(sr.since, now - c.window_s), now, c.cooling) if loop else None
        if trend is not None and trend.degraded:
            by_loop.setdefault(loop, []).append(sr)
            continue
        first = thermal[sr.node][0]
        why = trend.reason if trend is not None else f"{sr.node} has no cooling loop in the topology"
        out.append(
            Incident(
                cause=f"GPU-local cooling defect on {sr.node}: {first.subject} in thermal slowdown while {why}",
                fault_class=FaultClass.HARDWARE,
                component=Component.COOLING,
                confidence=0.75,
                action="drain_inspect_cooling",
                ts=now,
                onset=min(sr.since, first.ts),
                rule="seam:gpu-local-cooling",
                evidence=(
                    f"rank {sr.rank} on {sr.node} {sr.slowdown:.2f}x slower: {sr.evidence}".rstrip(": "),
                    first.line(),
                    why,
                ),
                blast_radius=BlastRadius(nodes=(sr.node,), ranks=(sr.rank,)),
                cost_gpu_s=slowdown_cost_gpu_s(gpus, sr.slowdown, max(0.0, now - sr.since)),
            )
        )
    for loop, ranks in sorted(by_loop.items()):
        onset = min(r.since for r in ranks)
        trend = cooling_trend(fac, loop, min(onset, now - c.window_s), now, c.cooling)
        members = topology.members("cooling_loop", loop)
        hot = sorted(n for n in members if n in thermal)
        slowest = max(ranks, key=lambda r: r.slowdown)
        conf = min(0.95, 0.8 + 0.05 * (len(hot) - 1))
        lines = [trend.reason]
        lines += [f"rank {r.rank} on {r.node} {r.slowdown:.2f}x slower since t={r.since:.0f}" for r in ranks]
        lines += [thermal[n][0].line() for n in hot]
        out.append(
            Incident(
                cause=(
                    f"cooling seam: loop {loop} is failing ({trend.reason.split(': ', 1)[-1]}); "
                    f"{len(hot)} node(s) in thermal slowdown, rank {slowest.rank} on {slowest.node} is the straggler"
                ),
                fault_class=FaultClass.FACILITY,
                component=Component.COOLING,
                confidence=conf,
                action="facility_alert_no_rma",
                ts=now,
                onset=onset,
                rule="seam:cooling-loop",
                evidence=tuple(lines),
                blast_radius=BlastRadius(
                    nodes=tuple(members),
                    ranks=tuple(sorted(r.rank for r in ranks)),
                    domain=f"cooling_loop:{loop}",
                ),
                cost_gpu_s=slowdown_cost_gpu_s(gpus, slowest.slowdown, max(0.0, now - onset)),
            )
        )
    return tuple(out)


@dataclass(frozen=True)
class NodeFault:
    node: str
    ts: float
    what: str  # one line: the finding or failure

    @classmethod
    def from_incidents(cls, incidents: Iterable[Incident]) -> tuple[NodeFault, ...]:
        """The node faults behind node-level incidents (one node in the blast radius, no shared domain)."""
        return tuple(
            cls(i.blast_radius.nodes[0], i.onset, i.cause)
            for i in incidents
            if len(i.blast_radius.nodes) == 1 and not i.blast_radius.domain
        )


@dataclass(frozen=True)
class BlastDecision:
    drain: tuple[str, ...]
    hold: tuple[str, ...]  # faulty nodes not drained (shared cause, or over the cap)
    incidents: tuple[Incident, ...]  # one per shared cause
    reason: str


def blast_radius(
    faults: Sequence[NodeFault], topology: Topology, now: float, cfg: SeamConfig | None = None
) -> BlastDecision:
    """Which faulty nodes to drain. Faults in the last ``shared_window_s`` on ``shared_min_nodes`` or more
    nodes of one domain (leaf switch first, then PDU, cooling loop, rack) are a shared cause: those
    nodes are held and the cause becomes one incident. Other faulty nodes drain, at most ``max_drains``."""
    c = cfg or SeamConfig()
    recent = [f for f in faults if now - c.shared_window_s <= f.ts <= now]
    left = {f.node for f in recent}
    incidents: list[Incident] = []
    held_shared: list[str] = []
    for kind in DOMAINS:
        groups: dict[str, set[str]] = {}
        for n in left:
            d = topology.domain_of(n, kind)
            if d:
                groups.setdefault(d, set()).add(n)
        for value, nodes in sorted(groups.items()):
            if len(nodes) < c.shared_min_nodes:
                continue
            members = topology.members(kind, value)
            mine = sorted((f for f in recent if f.node in nodes), key=lambda f: f.ts)
            frac = len(nodes) / max(1, len(members))
            incidents.append(
                Incident(
                    cause=(
                        f"shared cause: {len(nodes)} of {len(members)} nodes under {kind.replace('_', ' ')} "
                        f"{value} failed within {c.shared_window_s / 60:g} min"
                    ),
                    fault_class=FaultClass.FACILITY,
                    component=_DOMAIN_COMPONENT[kind],
                    confidence=round(min(0.95, 0.6 + 0.35 * frac), 4),
                    action="page_oncall_no_mass_drain",
                    ts=now,
                    onset=min(f.ts for f in mine),
                    rule=f"seam:shared-{kind}",
                    evidence=tuple(f"{f.node} t={f.ts:.0f}: {f.what}" for f in mine),
                    blast_radius=BlastRadius(nodes=tuple(members), domain=f"{kind}:{value}"),
                )
            )
            held_shared += sorted(nodes)
            left -= nodes
    independent = sorted(left, key=lambda n: min(f.ts for f in recent if f.node == n))
    drain = tuple(independent[: c.max_drains])
    over = tuple(independent[c.max_drains :])
    parts = []
    for inc in incidents:
        parts.append(
            f"do not mass drain: shared cause <{inc.blast_radius.domain.replace(':', ' ')}> "
            f"({len([n for n in held_shared if n in inc.blast_radius.nodes])} nodes held, page on-call)"
        )
    if drain:
        parts.append(f"drain {', '.join(drain)} (independent fault)")
    if over:
        parts.append(f"hold {', '.join(over)}: drain cap {c.max_drains} reached")
    if not parts:
        parts.append("no recent node faults")
    return BlastDecision(drain, tuple(held_shared) + over, tuple(incidents), "; ".join(parts))
