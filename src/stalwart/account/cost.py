"""The incident cost stack: what an incident took, in money and in training progress.

GPU-hour arithmetic alone understates an incident. The stack has five layers, each priced by
:class:`Prices` (all configurable, all default to documented round numbers, see docs/accounting.md):

1. **compute waste**: every GPU of the job idle or redoing work, from fault onset to the first
   productive step after recovery plus the re-done work (``gpus * (downtime + lost_work)``);
2. **reserved-capacity opportunity loss**: reserved GPUs that produced nothing and could not be lent
   out (the job's GPUs during the downtime, plus nodes excluded while in repair), priced at the
   *margin* a GPU-hour would have earned beyond its cost (``opportunity_gpu_hour``);
3. **rollback / regression loss**: degraded progress before the stop (slow steps, a loss spike
   rolled back beyond the last checkpoint): ``gpus * degraded_s * degraded_fraction``;
4. **incident-response labour**: responder hours times the loaded hourly rate;
5. **schedule slip**: the wall-clock delay to the run's end, priced per day of delay.

The same loss is expressed as progress: steps and tokens that could have been trained in the
wall-clock time the incident took.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from ..errors import ConfigError


class Prices(BaseModel):
    """Prices in one currency (default USD). Every field is non-negative."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu_hour: float = Field(default=2.0, ge=0, description="cost of one GPU-hour (amortised or rented)")
    opportunity_gpu_hour: float = Field(
        default=0.0, ge=0, description="margin lost per idle reserved GPU-hour"
    )
    engineer_hour: float = Field(default=150.0, ge=0, description="loaded cost of one responder-hour")
    slip_per_day: float = Field(default=0.0, ge=0, description="cost of delaying the run's end by one day")
    currency: str = "USD"


@dataclass(frozen=True)
class Incident:
    """What one incident did to a run. Times in seconds; ``gpus`` is the job's size at the onset."""

    gpus: int
    downtime_s: float  # onset -> first productive step after recovery (detect + decide + recover)
    lost_work_s: float = 0.0  # work re-done: from the last durable checkpoint to the onset
    degraded_s: float = 0.0  # time running degraded before the stop
    degraded_fraction: float = 0.0  # throughput lost while degraded, 0..1
    excluded_gpus: int = 0  # GPUs taken out of the pool for repair
    excluded_s: float = 0.0
    responder_hours: float = 0.0
    step_time_s: float = 0.0  # ideal step time, to express the loss as steps (0: unknown)
    tokens_per_step: float = 0.0
    label: str = ""

    def __post_init__(self) -> None:
        if self.gpus <= 0:
            raise ConfigError(
                f"incident {self.label or ''} has {self.gpus} GPUs; it needs at least one".replace("  ", " ")
            )
        for name in (
            "downtime_s",
            "lost_work_s",
            "degraded_s",
            "excluded_s",
            "responder_hours",
            "step_time_s",
            "tokens_per_step",
        ):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ConfigError(f"incident {name} must be a finite non-negative number, got {v!r}")
        if not 0.0 <= self.degraded_fraction <= 1.0:
            raise ConfigError(f"degraded_fraction must be within 0..1, got {self.degraded_fraction}")
        if self.excluded_gpus < 0:
            raise ConfigError(f"excluded_gpus must be non-negative, got {self.excluded_gpus}")


@dataclass(frozen=True)
class CostStack:
    compute_waste: float
    opportunity: float
    regression: float
    labor: float
    schedule_slip: float
    gpu_hours_lost: float
    wall_hours_lost: float
    steps_lost: float | None
    tokens_lost: float | None
    currency: str = "USD"
    label: str = ""

    @property
    def total(self) -> float:
        return self.compute_waste + self.opportunity + self.regression + self.labor + self.schedule_slip

    def as_dict(self) -> dict[str, object]:
        return {
            "label": self.label,
            "currency": self.currency,
            "compute_waste": self.compute_waste,
            "opportunity": self.opportunity,
            "regression": self.regression,
            "labor": self.labor,
            "schedule_slip": self.schedule_slip,
            "total": self.total,
            "gpu_hours_lost": self.gpu_hours_lost,
            "wall_hours_lost": self.wall_hours_lost,
            "steps_lost": self.steps_lost,
            "tokens_lost": self.tokens_lost,
        }


def incident_cost(inc: Incident, prices: Prices | None = None) -> CostStack:
    p = prices or Prices()
    wasted_h = (inc.downtime_s + inc.lost_work_s) / 3600.0
    degraded_h = inc.degraded_s * inc.degraded_fraction / 3600.0
    wall_h = wasted_h + degraded_h  # the run ends this much later
    gpu_h = inc.gpus * wall_h
    idle_reserved_gpu_h = inc.gpus * inc.downtime_s / 3600.0 + inc.excluded_gpus * inc.excluded_s / 3600.0
    steps = wall_h * 3600.0 / inc.step_time_s if inc.step_time_s > 0 else None
    tokens = steps * inc.tokens_per_step if steps is not None and inc.tokens_per_step > 0 else None
    return CostStack(
        compute_waste=inc.gpus * wasted_h * p.gpu_hour,
        opportunity=idle_reserved_gpu_h * p.opportunity_gpu_hour,
        regression=inc.gpus * degraded_h * p.gpu_hour,
        labor=inc.responder_hours * p.engineer_hour,
        schedule_slip=wall_h / 24.0 * p.slip_per_day,
        gpu_hours_lost=gpu_h,
        wall_hours_lost=wall_h,
        steps_lost=steps,
        tokens_lost=tokens,
        currency=p.currency,
        label=inc.label,
    )


def run_cost(
    incidents: Iterable[Incident], prices: Prices | None = None
) -> tuple[list[CostStack], CostStack]:
    """Per-incident stacks and their sum for the run."""
    stacks = [incident_cost(i, prices) for i in incidents]
    cur = (prices or Prices()).currency

    def total(attr: str) -> float:
        return sum(getattr(s, attr) for s in stacks)

    def opt_total(attr: str) -> float | None:
        vals = [getattr(s, attr) for s in stacks]
        return None if not vals or any(v is None for v in vals) else sum(vals)

    run = CostStack(
        compute_waste=total("compute_waste"),
        opportunity=total("opportunity"),
        regression=total("regression"),
        labor=total("labor"),
        schedule_slip=total("schedule_slip"),
        gpu_hours_lost=total("gpu_hours_lost"),
        wall_hours_lost=total("wall_hours_lost"),
        steps_lost=opt_total("steps_lost"),
        tokens_lost=opt_total("tokens_lost"),
        currency=cur,
        label="run",
    )
    return stacks, run
