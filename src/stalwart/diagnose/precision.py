"""Detectors that know their precision: join each firing with what followed (pure, over events).

A *firing* is a detector saying "fault": ``FailureDetected`` (detector = its ``failure`` kind),
<<<<<<< HEAD
``StragglerDetected`` (``straggler``), ``SilentCorruption`` (``sdc``, at each replica it names; a
replay that names none is no new firing), a failing ``HealthChecked`` (``health.<level>``), a
``CheckpointRejected`` (``checkpoint_verify``: the load refused a damaged checkpoint). It is
=======
``StragglerDetected`` (``straggler``), ``SilentCorruption`` (``sdc``, at each replica it names), a failing ``HealthChecked`` (``health.<level>``), a
``CheckpointRejected`` or ``CheckpointDamaged`` (``checkpoint_verify``: the load refused a damaged
checkpoint, or background verification found one and set it aside before any load). It is
>>>>>>> hdemo
*confirmed* when, on the same rank (or node), within ``window_s``:

- a ``ChaosInjected`` fault preceded it (ground truth in chaos runs); a fault that holds for a span of
  steps (``slow``, ``until_step``) counts from its first slowed step until ``window_s`` after the
  span's last step;
- a failing health check on that node (for detectors other than health itself);
- an incident that names a real cause there (a cross-layer or seam rule that found node evidence:
  a kernel-log Xid, a link down, a thermal slowdown; not "no node-level cause");
- a recovery that fixed it: a ``DecisionTaken`` excluding or draining that node, after which the
  same detector stayed silent there for ``window_s`` while training made progress.

Anything else is unconfirmed (a false positive, as far as the ledger can tell). Recall comes from
the chaos faults: each fault kind names the detectors that should catch it.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from ..events import (
    ChaosInjected,
    CheckpointRejected,
    DecisionTaken,
    Event,
    FailureDetected,
    IncidentRaised,
    StepCompleted,
    StragglerDetected,
)
from ..events.checkpoint import CheckpointDamaged
from ..events.integrity import SilentCorruption
from ..policy.label import Label

FIXING_ACTIONS = ("exclude_node", "drain", "exclude_quarantine", "quarantine")

# chaos fault kind -> the detectors that should catch it
EXPECTED_DETECTORS: dict[str, tuple[str, ...]] = {
    "crash": ("crash",),
    "exit": ("crash",),
    "raise": ("exception",),  # the agent's failure kind for an uncaught exception
    "hang": ("hang",),
    "slow": ("straggler",),
    "kill-agent": ("agent_lost",),
    # background verification sets the damaged version aside, or a load refuses it
    "corrupt-checkpoint": ("checkpoint_verify",),
    "truncate-checkpoint": ("checkpoint_verify",),
    "bitflip": ("sdc",),  # the cross-replica check names the rank (train/replica_check.py)
}


class PrecisionConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    window_s: float = Field(default=300.0, gt=0, description="how far a confirmation may be from the firing")
    expected: dict[str, tuple[str, ...]] = Field(
        default_factory=lambda: dict(EXPECTED_DETECTORS),
        description="chaos fault kind -> the detectors that should catch it",
    )


@dataclass(frozen=True)
class Firing:
    detector: str
    ts: float
    node: str
    rank: int


@dataclass(frozen=True)
class DetectorStats:
    detector: str
    firings: int
    confirmed: int
    faults: int  # chaos faults this detector should have caught
    caught: int

    @property
    def precision(self) -> float | None:
        return self.confirmed / self.firings if self.firings else None

    @property
    def recall(self) -> float | None:
        return self.caught / self.faults if self.faults else None


def firings(events: Iterable[Event]) -> tuple[Firing, ...]:
    out = []
    for e in events:
        if isinstance(e, FailureDetected):
            out.append(Firing(e.failure, e.ts, e.node, e.rank))
        elif isinstance(e, StragglerDetected):
            out.append(Firing("straggler", e.ts, e.node, e.rank))
        elif e.kind == "HealthChecked" and getattr(e, "status", "") == "fail":
            out.append(Firing(f"health.{getattr(e, 'level', 'passive')}", e.ts, e.node, -1))
        elif isinstance(e, (CheckpointRejected, CheckpointDamaged)):
            out.append(Firing("checkpoint_verify", e.ts, e.node, -1))
        elif isinstance(e, SilentCorruption):  # one firing per replica it names (none named: its writer's)
            if e.verdict == "replayed" and not e.suspect_ranks:
                continue  # a replay that names no replica: its mismatch already fired
            named = zip(e.suspect_ranks, e.suspect_nodes, strict=False)
            out += [Firing("sdc", e.ts, n, r) for r, n in named] or [Firing("sdc", e.ts, e.node, -1)]
    return tuple(sorted(out, key=lambda f: f.ts))


def _same_place(f: Firing, node: str, rank: int) -> bool:
    if f.rank >= 0 and rank >= 0:
        return f.rank == rank
    return bool(node) and f.node == node


@dataclass(frozen=True)
class _Index:
    """The events confirmation looks at, pulled out once (a ledger is mostly StepCompleted)."""

    chaos: tuple[ChaosInjected, ...]
    health_fail: tuple[Event, ...]
    fixes: tuple[DecisionTaken, ...]
    step_ts: tuple[float, ...]  # sorted
    causes: tuple[IncidentRaised, ...] = ()  # incidents that found a cause in node evidence
    span_end: dict[int, float] = field(default_factory=dict)  # id(chaos event) -> when its span ended

    @classmethod
    def of(cls, evs: Sequence[Event]) -> _Index:
        chaos = tuple(e for e in evs if isinstance(e, ChaosInjected))
        return cls(
            chaos,
            tuple(e for e in evs if e.kind == "HealthChecked" and getattr(e, "status", "") == "fail"),
            tuple(e for e in evs if isinstance(e, DecisionTaken) and e.action in FIXING_ACTIONS),
            tuple(sorted(e.ts for e in evs if isinstance(e, StepCompleted))),
            tuple(
                e
                for e in evs
                if isinstance(e, IncidentRaised)
                and e.rule.startswith(("cross_layer:", "seam:"))
                and e.rule != "cross_layer:no-cause"
            ),
            _span_ends(chaos, evs),
        )

    def fault_until(self, x: ChaosInjected) -> float:
        """When a fault stopped acting: its injection, or the end of its span of steps."""
        return self.span_end.get(id(x), x.ts)

    def stepped(self, after: float, until: float) -> bool:
        i = bisect.bisect_right(self.step_ts, after)
        return i < len(self.step_ts) and self.step_ts[i] <= until


def _span_ends(chaos: Sequence[ChaosInjected], evs: Sequence[Event]) -> dict[int, float]:
    """For each span fault, the time the first step past its span completed (open: never)."""
    out: dict[int, float] = {}
    for x in chaos:
        if x.until_step < 0 and x.fault != "slow":
            continue
        ends = [
            e.ts for e in evs if isinstance(e, StepCompleted) and e.ts >= x.ts and 0 <= x.until_step <= e.step
        ]
        out[id(x)] = min(ends) if ends else math.inf
    return out


def _confirmed(f: Firing, ix: _Index, fires: Sequence[Firing], w: float) -> bool:
    if any(e.ts <= f.ts <= ix.fault_until(e) + w and _same_place(f, e.node, e.rank) for e in ix.chaos):
        return True
    if not f.detector.startswith("health") and any(
        abs(e.ts - f.ts) <= w and e.node and e.node == f.node for e in ix.health_fail
    ):
        return True
    for inc in ix.causes:
        if abs(inc.onset - f.ts) > w and abs(inc.ts - f.ts) > w:
            continue
        if inc.ranks and f.rank >= 0 and f.node in inc.nodes:
            if f.rank in inc.ranks:
                return True
        elif f.node and f.node in inc.nodes:
            return True
    for e in ix.fixes:
        if not f.ts <= e.ts <= f.ts + w or (e.node and f.node and e.node != f.node):
            continue
        again = any(g.detector == f.detector and e.ts < g.ts <= e.ts + w and g.node == f.node for g in fires)
        if not again and ix.stepped(e.ts, e.ts + w):
            return True
    return False


def detector_stats(events: Iterable[Event], cfg: PrecisionConfig | None = None) -> tuple[DetectorStats, ...]:
    """Precision and recall per detector over one ledger (any order)."""
    c = cfg or PrecisionConfig()
    evs = sorted(events, key=lambda e: e.ts)
    fires = firings(evs)
    ix = _Index.of(evs)
    names = sorted({f.detector for f in fires} | {d for ds in c.expected.values() for d in ds})
    faults = ix.chaos
    out = []
    for name in names:
        mine = [f for f in fires if f.detector == name]
        confirmed = sum(1 for f in mine if _confirmed(f, ix, fires, c.window_s))
        expected = [x for x in faults if name in c.expected.get(x.fault, ())]
        caught = sum(
            1
            for x in expected
            if any(
                x.ts <= f.ts <= ix.fault_until(x) + c.window_s and _same_place(f, x.node, x.rank)
                for f in mine
            )
        )
        if mine or expected:
            out.append(DetectorStats(name, len(mine), confirmed, len(expected), caught))
    return tuple(out)


class GateMode(Label):
    """Whether a detector's automatic action may be carried out (the value is what reports print)."""

    ACT = "act"
    OBSERVE = "observe"


@dataclass(frozen=True)
class GateDecision:
    detector: str
    mode: GateMode
    reason: str


def precision_gate(stats: DetectorStats, threshold: float = 0.9, min_firings: int = 5) -> GateDecision:
    """Observe-only until the detector has fired ``min_firings`` times with precision >= ``threshold``."""
    p = stats.precision
    if stats.firings < min_firings or p is None:
        return GateDecision(
            stats.detector,
            GateMode.OBSERVE,
            f"{stats.detector}: observe only, {stats.firings} firing(s) < {min_firings} needed "
            f"to measure precision",
        )
    if p < threshold:
        return GateDecision(
            stats.detector,
            GateMode.OBSERVE,
            f"{stats.detector}: observe only, precision {p:.2f} ({stats.confirmed}/{stats.firings}) "
            f"< {threshold:g}",
        )
    return GateDecision(
        stats.detector,
        GateMode.ACT,
        f"{stats.detector}: may act, precision {p:.2f} ({stats.confirmed}/{stats.firings}) >= {threshold:g}",
    )


def precision_table(
    stats: Sequence[DetectorStats], threshold: float = 0.9, min_firings: int = 5
) -> list[str]:
    """The per-detector table for the report (Markdown lines)."""

    def pct(v: float | None) -> str:
        return "n/a" if v is None else f"{v * 100:.0f}%"

    lines = [
        "| detector | firings | confirmed | precision | chaos faults | caught | recall | mode |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for s in stats:
        mode = precision_gate(s, threshold, min_firings).mode
        lines.append(
            f"| {s.detector} | {s.firings} | {s.confirmed} | {pct(s.precision)} | {s.faults} | "
            f"{s.caught} | {pct(s.recall)} | {mode} |"
        )
    return lines
