"""Straggler -> action: keep going slow, or restart without the slow node? (pure policy)

Both options are priced in GPU-seconds of the job's reservation (every reserved GPU for every
extra second of wall clock):

- continue: ``(slowdown - 1) x step_time x remaining_steps x gpus``; the whole job runs at the
  straggler's pace;
- exclude: ``gpus x (recovery_s + remaining_time x (W / W' - 1))``; the restart's downtime, plus the
  longer run at the next valid world size ``W'`` (the same size when a hot spare steps in). The plan
  comes from :func:`stalwart.policy.world_size.replace_failed`.

It acts only when the detection is confident enough, the slowdown is above the noise floor,
excluding is cheaper by a margin, and the node's agent serves no store the other nodes need (the
c10d rendezvous store; the round's store, as the group's first node: its exit would end the job,
:func:`stalwart.policy.world_size.needed_by_others`); otherwise it keeps going and says why. Whether
its ``exclude`` is carried out is the gate's call (:func:`straggler_gate`): observe-only by default, or enabled by the
detector's measured precision (the issue's "automatic actions start in observe-only mode").
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import assert_never

from ..errors import ConfigError
from ..policy.label import Label
from ..policy.world_size import SizeRule, WorldPlan, needed_by_others, replace_failed
from .incident import BlastRadius, Component, FaultClass, Incident, slowdown_cost_gpu_s
from .precision import DetectorStats, GateDecision, GateMode, precision_gate


class StragglerAction(Label):
    """What the straggler policy advises (the value goes into incidents and the ledger)."""

    KEEP = "keep"
    EXCLUDE_QUARANTINE = "exclude_quarantine"


class StragglerMode(Label):
    """``--straggler-action``: whether the policy's exclusion may be carried out."""

    OBSERVE = "observe"  # never act (the default)
    AUTO = "auto"  # act once the detector's measured precision allows it
    ACT = "act"  # act, unless measured precision says otherwise


class StragglerActionConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    min_confidence: float = Field(
        default=0.8, ge=0, le=1, description="act only on detections at least this sure"
    )
    min_slowdown: float = Field(default=1.1, ge=1, description="below this the slowdown is noise: never act")
    margin: float = Field(
        default=1.5, ge=1, description="continuing must cost this many times more than excluding"
    )
    recovery_s: float = Field(
        default=300.0, ge=0, description="restart + reload until the first productive step"
    )


@dataclass(frozen=True)
class StragglerCase:
    node: str
    rank: int
    slowdown: float  # job step time with the straggler / without it
    confidence: float  # 0..1, from the detector (e.g. k-of-n windows agreeing)
    since: float

    def __post_init__(self) -> None:
        if not (self.slowdown > 0 and 0.0 <= self.confidence <= 1.0):
            raise ConfigError(
                f"straggler case needs slowdown > 0 and confidence in 0..1, got "
                f"{self.slowdown!r}, {self.confidence!r}"
            )


@dataclass(frozen=True)
class Workload:
    plan: WorldPlan  # the current world: active nodes, spares
    step_time_s: float  # healthy step time at the current world size
    remaining_steps: int
    min_nodes: int
    max_nodes: int
    rule: SizeRule = SizeRule()
    hosts: str = ""  # the stores the straggler's agent serves ("": none; see needed_by_others)


@dataclass(frozen=True)
class StragglerDecision:
    action: StragglerAction
    reason: str
    continue_cost_gpu_s: float
    exclude_cost_gpu_s: float
    next_plan: WorldPlan | None
    incident: Incident

    @property
    def exclude(self) -> bool:
        return self.action is StragglerAction.EXCLUDE_QUARANTINE


def decide_straggler(
    case: StragglerCase, work: Workload, now: float, cfg: StragglerActionConfig | None = None
) -> StragglerDecision:
    c = cfg or StragglerActionConfig()
    gpus = work.plan.world_size
    remaining_s = work.step_time_s * max(0, work.remaining_steps)
    cont = max(0.0, case.slowdown - 1.0) * remaining_s * gpus
    nxt = replace_failed(work.plan, [case.node], work.min_nodes, work.max_nodes, work.rule)
    if nxt.runnable:
        shrink = gpus / nxt.world_size - 1.0
        excl = gpus * (c.recovery_s + remaining_s * shrink)
        how = (
            f"hot spare keeps {nxt.world_size} processes"
            if nxt.world_size == gpus
            else f"next valid size {nxt.world_size} of {gpus} processes"
        )
    else:
        excl = float("inf")
        how = "no valid world size without it"
    costs = f"continuing slow costs {gpu_time(cont)}, restarting without {case.node} {gpu_time(excl)} ({how})"
    pinned = needed_by_others(case.node, work.plan, work.hosts)
    action, why = _weigh(case, c, nxt, cont, excl, costs, pinned)
    lead = f"rank {case.rank} on {case.node} makes the job {case.slowdown:.2f}x slower"
    incident = Incident(
        cause=f"straggler: {lead}",
        fault_class=FaultClass.UNKNOWN,
        component=Component.STRAGGLER,
        confidence=case.confidence,
        action=action.value,
        ts=now,
        onset=case.since,
        rule="policy:straggler-action",
        evidence=(why, f"{work.remaining_steps} steps of {work.step_time_s:g} s left on {gpus} processes"),
        blast_radius=BlastRadius(nodes=(case.node,), ranks=(case.rank,)),
        cost_gpu_s=slowdown_cost_gpu_s(gpus, case.slowdown, max(0.0, now - case.since)),
    )
    return StragglerDecision(action, why, cont, excl, nxt if nxt.runnable else None, incident)


def _weigh(
    case: StragglerCase,
    c: StragglerActionConfig,
    nxt: WorldPlan,
    cont: float,
    excl: float,
    costs: str,
    pinned: str = "",
) -> tuple[StragglerAction, str]:
    """Keep going or exclude, and why: the noise floor, the detection's confidence, a valid world
    without the node, a store the other nodes need from its agent (``pinned``: why it cannot leave),
    then the costs with their margin."""
    keep = StragglerAction.KEEP
    if case.slowdown < c.min_slowdown:
        return keep, f"keep going: {case.slowdown:.2f}x is below the noise floor {c.min_slowdown:g}x"
    if case.confidence < c.min_confidence:
        return keep, (
            f"keep going (observe): detection confidence {case.confidence:.2f} < {c.min_confidence:g}; {costs}"
        )
    if not nxt.runnable:
        return keep, f"keep going: {nxt.reason}"
    if pinned:  # excluding it would end the job, whatever the costs say
        return keep, f"keep going, {case.node} is not excluded: {pinned}; {costs}"
    if cont > c.margin * excl:
        return StragglerAction.EXCLUDE_QUARANTINE, f"exclude {case.node} and quarantine it: {costs}"
    return keep, f"keep going: {costs}; excluding pays off only above {c.margin:g}x"


def gpu_time(gpu_s: float) -> str:
    """GPU time for a reason line: GPU-hours from 0.1 GPU-h on, GPU-seconds below (a short run's
    costs would all read 0.0 GPU-h)."""
    if gpu_s == float("inf"):
        return "unbounded"
    return f"{gpu_s / 3600:,.1f} GPU-h" if gpu_s >= 360 else f"{gpu_s:,.0f} GPU-s"


def confidence_from_windows(flagged: int, seen: int, k: int) -> float:
    """A detector confidence from k-of-n debouncing: 0 below k, rising to 1 when every window agrees."""
    if seen <= 0 or flagged < k:
        return 0.0
    return round(0.5 + 0.5 * flagged / seen, 4)


# --- the precision gate: may the policy's "exclude" be carried out? -------------------------------

STRAGGLER_MODES = tuple(m.value for m in StragglerMode)  # the flag's values, in this order


def straggler_gate(
    mode: str | StragglerMode,
    stats: DetectorStats | None,
    *,
    min_precision: float = 0.9,
    min_firings: int = 5,
    cannot_leave: str = "",
) -> GateDecision:
    """Whether the straggler policy's ``exclude`` is carried out this attempt, and why (pure).

    ``stats`` is the straggler detector's measured precision over the history before this attempt
    (None: no firing in it). Modes:

    - ``observe``: never act (the default);
    - ``auto``: observe-only until the detector has fired ``min_firings`` times with precision at
      least ``min_precision`` (:func:`stalwart.diagnose.precision.precision_gate`);
    - ``act``: act, unless the measured precision is below ``min_precision`` over at least
      ``min_firings`` firings: measured evidence against the detector overrides the setting.

    ``cannot_leave``: why this node cannot leave the job at all (e.g. its agent hosts the c10d
    rendezvous store); then nothing is carried out, whatever the mode.
    """
    try:
        m = StragglerMode(mode)
    except ValueError:
        raise ConfigError(
            f"--straggler-action {mode!r} must be one of {', '.join(STRAGGLER_MODES)}"
        ) from None
    match m:
        case StragglerMode.OBSERVE:
            return GateDecision(
                "straggler", GateMode.OBSERVE, "straggler action: observe only (--straggler-action observe)"
            )
        case StragglerMode.AUTO | StragglerMode.ACT if cannot_leave:
            return GateDecision(
                "straggler", GateMode.OBSERVE, f"straggler action: observe only, {cannot_leave}"
            )
        case StragglerMode.AUTO:
            measured = precision_gate(stats or _UNSEEN, min_precision, min_firings)
            return GateDecision("straggler", measured.mode, f"--straggler-action auto: {measured.reason}")
        case StragglerMode.ACT:
            return _act(stats or _UNSEEN, min_precision, min_firings)
        case _:
            assert_never(m)


_UNSEEN = DetectorStats("straggler", 0, 0, 0, 0)  # no firing in the history


def _act(s: DetectorStats, min_precision: float, min_firings: int) -> GateDecision:
    """``act``: act, unless the measured precision is against the detector."""
    measured = precision_gate(s, min_precision, min_firings)
    if s.firings >= min_firings and s.precision is not None and s.precision < min_precision:
        return GateDecision(
            "straggler",
            GateMode.OBSERVE,
            f"--straggler-action act, overridden: {measured.reason} in the history",
        )
    match measured.mode:
        case GateMode.ACT:
            return GateDecision("straggler", GateMode.ACT, f"--straggler-action act: {measured.reason}")
        case GateMode.OBSERVE:
            return GateDecision(
                "straggler",
                GateMode.ACT,
                f"--straggler-action act: precision not measured yet ({s.firings} firing(s) in the history, "
                f"{min_firings} needed); acting as asked",
            )
        case _:
            assert_never(measured.mode)
