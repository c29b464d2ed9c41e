"""Interval advisor: how often to checkpoint each tier, from measured costs and the MTBF.

With two-phase saves the training loop pays only the stall per checkpoint, so the stall is the
checkpoint cost delta in Young's and Daly's formulas (their arithmetic is
:mod:`stalwart.policy.checkpoint_interval`'s, shared with :mod:`stalwart.account.ettr`):

* Young (1974): ``T = sqrt(2 * delta * M)``
* Daly (2006), for ``delta < 2M``: ``T = sqrt(2 delta M) * (1 + sqrt(delta/(2M))/3 + (delta/(2M))/9) - delta``;
  ``T = M`` otherwise.

A tier cannot usefully be checkpointed more often than its persist takes (the next save would find
the staging buffers still busy), so the persist time is a floor. ``M`` per tier is the MTBF of the
failures that tier has to cover: every failure for the memory tier; only failures that lose the
node's memory (``memory_loss_fraction``) for local disk; only failures that lose the node
(``node_loss_fraction``) for the shared and object tiers. Pure functions; :class:`AutoInterval`
applies the advice to an engine when the user opts in.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..events import CheckpointCommitted, CheckpointStaged, Event, FailureDetected, StepCompleted
from ..events.checkpoint import CheckpointIntervalAdvised
from ..policy.checkpoint_interval import daly_interval, young_interval
from ..terminal import plural

if TYPE_CHECKING:
    from .engine import CheckpointEngine  # engine pulls in torch

__all__ = [
    "DEFAULT_MTBF_S",
    "AutoInputs",
    "AutoInterval",
    "IntervalChoice",
    "decide_interval",
    "inputs_from_events",
    "mtbf_of_run",
    "recommend_from_ledger",
    "IntervalAdvice",
    "advise",
    "advise_tier",
    "daly_interval",
    "tier_mtbf",
    "young_interval",
]


@dataclass(frozen=True)
class IntervalAdvice:
    tier: str
    interval_s: float
    interval_steps: int
    mtbf_s: float
    reason: str


def tier_mtbf(kind: str, mtbf_s: float, memory_loss_fraction: float, node_loss_fraction: float) -> float:
    if kind == "memory":
        return mtbf_s
    if kind == "local":
        return mtbf_s / memory_loss_fraction
    return mtbf_s / node_loss_fraction


def advise_tier(
    name: str,
    kind: str,
    *,
    stall_s: float,
    persist_s: float,
    mtbf_s: float,
    step_time_s: float,
    memory_loss_fraction: float = 1.0,
    node_loss_fraction: float = 1.0,
    persist_margin: float = 1.2,
) -> IntervalAdvice:
    """The Daly interval for one tier, floored at its persist time, in seconds and steps."""
    for label, v in (("mtbf_s", mtbf_s), ("step_time_s", step_time_s)):
        if not v > 0:
            raise ConfigError(f"{label}={v} must be positive", "pass measured, positive values")
    for label, v in (
        ("memory_loss_fraction", memory_loss_fraction),
        ("node_loss_fraction", node_loss_fraction),
    ):
        if not 0 < v <= 1:
            raise ConfigError(f"{label}={v} must be in (0, 1]", "use the share of failures that lose it")
    m = tier_mtbf(kind, mtbf_s, memory_loss_fraction, node_loss_fraction)
    cost = max(stall_s, 1e-6)
    daly = daly_interval(cost, m)
    floor = persist_s * persist_margin
    interval = max(daly, floor, step_time_s)
    steps = max(1, round(interval / step_time_s))
    why = (
        f"{name}: Daly interval {daly:.1f}s from stall {stall_s:.3f}s and MTBF {m:.0f}s"
        if interval == daly
        else f"{name}: persist takes {persist_s:.1f}s, longer than the Daly interval {daly:.1f}s; "
        f"interval held at {interval:.1f}s"
        if interval == floor
        else f"{name}: Daly interval {daly:.2f}s is below one step ({step_time_s:.2f}s)"
    )
    return IntervalAdvice(name, interval, steps, m, f"{why} -> every {steps} steps")


def advise(
    tiers: list[tuple[str, str]],
    *,
    stall_s: float,
    persist_s: Mapping[str, float],
    mtbf_s: float,
    step_time_s: float,
    memory_loss_fraction: float = 1.0,
    node_loss_fraction: float = 1.0,
) -> list[IntervalAdvice]:
    """Advice for each ``(name, kind)``; a tier with no measured persist time uses 0 as its floor."""
    return [
        advise_tier(
            n,
            k,
            stall_s=stall_s,
            persist_s=persist_s.get(n, 0.0),
            mtbf_s=mtbf_s,
            step_time_s=step_time_s,
            memory_loss_fraction=memory_loss_fraction,
            node_loss_fraction=node_loss_fraction,
        )
        for n, k in tiers
    ]


class AutoInterval:
    """Opt-in auto mode: re-advises every ``every_steps`` steps from the engine's measurements and
    applies the intervals (``engine.set_interval``). The SDK calls :meth:`observe_step` each step."""

    def __init__(
        self,
        engine: CheckpointEngine,
        *,
        mtbf_s: float,
        every_steps: int = 100,
        apply: bool = True,
        memory_loss_fraction: float = 1.0,
        node_loss_fraction: float = 1.0,
        sink: Callable[[Event], None] | None = None,
        wall: Callable[[], float] | None = None,
    ) -> None:

        self.engine = engine
        self.mtbf_s = mtbf_s
        self.every_steps = every_steps
        self.apply = apply
        self.fractions = (memory_loss_fraction, node_loss_fraction)
        self._sink = sink or (lambda ev: None)
        self._wall = wall or time.time
        self._step_time: float | None = None
        self._last_update: int | None = None
        self.advice: list[IntervalAdvice] = []

    def observe_step(self, step: int, duration_s: float) -> list[IntervalAdvice]:
        """Feed one step time; returns new advice when it was recomputed (else an empty list)."""
        self._step_time = duration_s if self._step_time is None else 0.9 * self._step_time + 0.1 * duration_s
        stall = getattr(self.engine, "last_stall_s", None)
        if stall is None or (self._last_update is not None and step - self._last_update < self.every_steps):
            return []
        self._last_update = step
        tiers: list[tuple[str, str]] = [(t.name, t.kind) for t in self.engine.tiers]
        self.advice = advise(
            tiers,
            stall_s=stall,
            persist_s=dict(self.engine.last_persist_s),
            mtbf_s=self.mtbf_s,
            step_time_s=self._step_time,
            memory_loss_fraction=self.fractions[0],
            node_loss_fraction=self.fractions[1],
        )
        for a in self.advice:
            changed = self.engine.tier(a.tier).every_steps != a.interval_steps
            if self.apply and changed:
                self.engine.set_interval(a.tier, a.interval_steps)
            if changed and getattr(self.engine, "rank", 0) == 0:
                self._sink(
                    CheckpointIntervalAdvised(
                        ts=self._wall(),
                        tier=a.tier,
                        interval_steps=a.interval_steps,
                        interval_s=a.interval_s,
                        reason=a.reason,
                        applied=self.apply,
                    )
                )
        return self.advice

    def should_save(self, step: int) -> bool:
        return bool(self.engine.due_tiers(step))


# --- --checkpoint-every auto: one decision, the same for a live run and for `plan --ledger` ----------

DEFAULT_MTBF_S = 24 * 3600.0  # no failure seen and no history: one interruption a day (stated default)
PERSIST_MARGIN = 1.2  # a persist must finish this much before the next save begins


@dataclass(frozen=True)
class AutoInputs:
    """What the interval rests on, measured: seconds per step, the stall a save costs the loop, the
    background persist time, and the mean time between failures with where it came from."""

    step_s: float
    stall_s: float
    persist_s: float
    mtbf_s: float
    mtbf_source: str  # "this run: 3 failures in 120 s of training", "default: ..."


@dataclass(frozen=True)
class IntervalChoice:
    steps: int
    interval_s: float
    daly_s: float
    floor_s: float
    reason: str


def decide_interval(x: AutoInputs) -> IntervalChoice:
    """Daly's optimum (``policy.checkpoint_interval``, the arithmetic ``account.ettr`` uses) on the
    measured stall and MTBF, bounded below so the previous persist always finishes before the next
    save (``persist_s * PERSIST_MARGIN``) and by one step; in whole steps."""
    step = max(x.step_s, 1e-6)
    daly = daly_interval(max(x.stall_s, 1e-6), max(x.mtbf_s, 1e-6))
    floor = x.persist_s * PERSIST_MARGIN
    steps = max(1, round(daly / step), math.ceil(floor / step))
    bound = "Daly" if steps == max(1, round(daly / step)) and daly >= floor else "persist floor"
    reason = (
        f"every {steps} steps ({steps * step:.2f}s): {bound}; Daly {daly:.2f}s from stall {x.stall_s:.3f}s "
        f"and MTBF {x.mtbf_s:.0f}s ({x.mtbf_source}); persist {x.persist_s:.2f}s needs >= {floor:.2f}s "
        f"between saves; step {step:.3f}s"
    )
    return IntervalChoice(steps, steps * step, daly, floor, reason)


def mtbf_of_run(failures: int, training_s: float, history_mtbf_s: float | None = None) -> tuple[float, str]:
    """The run's own MTBF when it has failed, else the node history's, else :data:`DEFAULT_MTBF_S`."""
    if failures > 0 and training_s > 0:
        return (
            training_s / failures,
            f"this run: {plural(failures, 'failure')} in {training_s:.0f}s of training",
        )
    if history_mtbf_s is not None and history_mtbf_s > 0:
        return history_mtbf_s, "node history"
    return DEFAULT_MTBF_S, f"default {DEFAULT_MTBF_S / 3600:.0f} h (no failure yet)"


def inputs_from_events(events: Iterable[Event], *, history_mtbf_s: float | None = None) -> AutoInputs | None:
    """The inputs a run's ledger gives (medians over every rank); None before a checkpoint committed."""

    steps: list[float] = []
    ranks: set[int] = set()
    stalls: list[float] = []
    staged: dict[tuple[int, int, int], float] = {}
    persists: list[float] = []
    failures = 0
    for e in events:
        if isinstance(e, StepCompleted):
            steps.append(e.duration)
            ranks.add(e.rank)
        elif isinstance(e, CheckpointStaged):
            stalls.append(e.stall_s)
            staged[(e.attempt, e.rank, e.step)] = e.ts
        elif isinstance(e, CheckpointCommitted) and (e.attempt, e.rank, e.step) in staged:
            persists.append(max(0.0, e.ts - staged[(e.attempt, e.rank, e.step)]))
        elif isinstance(e, FailureDetected):
            failures += 1
    if not steps or not stalls:
        return None
    training_s = sum(steps) / max(1, len(ranks))
    mtbf, source = mtbf_of_run(failures, training_s, history_mtbf_s)
    return AutoInputs(
        statistics.median(steps),
        statistics.median(stalls),
        statistics.median(persists or [0.0]),
        mtbf,
        source,
    )


def recommend_from_ledger(
    events: Iterable[Event], *, history_mtbf_s: float | None = None
) -> IntervalChoice | None:
    """``--checkpoint-every auto``'s choice for a recorded run: what ``plan --ledger`` recommends."""
    x = inputs_from_events(list(events), history_mtbf_s=history_mtbf_s)
    return decide_interval(x) if x is not None else None
