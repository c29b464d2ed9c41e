"""Simulator configuration (pydantic, validated on construction) and the default failure mix.

The default mix is the 54-day snapshot of Llama 3 405B pre-training on 16,384 H100 GPUs (Llama Team,
"The Llama 3 Herd of Models", arXiv 2407.21783, Table 5): 419 unexpected interruptions, plus 47
planned ones (automated maintenance). Counts are taken from the table; rates are counts divided by
16,384 x 54 GPU-days. Detection latencies and whether a class costs a node are *our* assumptions
(the paper gives none): hard GPU/host faults surface as a crash or XID within a minute, network
faults and NCCL hangs as a collective timeout (10 min), silent data corruption only when someone
notices a loss anomaly (1 h).
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..errors import ConfigError
from ..settings.recovery import SdcSettings
from ..settings.schema import HangSettings
from ..settings.sources import flat_name, leaves, nest
from .repair import RepairPipeline

LLAMA3_GPUS = 16_384
LLAMA3_DAYS = 54.0
LLAMA3_PLANNED = 47

# (component class, interruptions in the 54-day snapshot, costs a node?, detection latency s)
LLAMA3_TABLE5: tuple[tuple[str, int, bool, float], ...] = (
    ("faulty_gpu", 148, True, 60.0),
    ("gpu_hbm3", 72, True, 60.0),
    ("software_bug", 54, False, 30.0),
    ("network_switch_cable", 35, True, 600.0),
    ("host_maintenance", 32, True, 60.0),
    ("gpu_sram", 19, True, 60.0),
    ("gpu_system_processor", 17, True, 60.0),
    ("nic", 7, True, 600.0),
    ("nccl_watchdog_timeout", 7, False, 600.0),
    ("silent_data_corruption", 6, True, 3600.0),
    ("gpu_thermal_interface_sensor", 6, True, 60.0),
    ("ssd", 3, True, 60.0),
    ("power_supply", 3, True, 60.0),
    ("server_chassis", 2, True, 60.0),
    ("io_expansion_board", 2, True, 60.0),
    ("dependency", 2, False, 60.0),
    ("cpu", 2, True, 60.0),
    ("system_memory", 2, True, 60.0),
)


MAX_GPUS = 10_000_000
MAX_DAYS = 3650.0
MAX_TRIALS = 1_000_000
MAX_SPARES = MAX_GPUS
MAX_FAILURE_CLASSES = 1000
MAX_SECONDS = 1e9  # ~31 years: any time setting beyond this is a unit mistake
MAX_MEMORY_BYTES = 4 << 30  # the engine's working set per run; above this the run is refused up front
_FINITE = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class FailureClass(BaseModel):
    model_config = _FINITE

    name: str = Field(max_length=100)
    per_1000_gpu_days: float = Field(ge=0, description="failures per 1000 GPU-days of exposure")
    node_loss: bool = True  # the node must be replaced (hot spare, shrink, or wait for repair)
    detect_s: float = Field(60.0, ge=0)
    # "hang": detected by the agent's hang timeout (policy.timeouts) when SimConfig.step_s is set
    kind: Literal["crash", "hang"] = "crash"
    in_place: bool = Field(
        default=False,
        description="recovered in place: the survivors keep their processes and live state and only "
        "the failed ranks are replaced, so nothing rolls back to the checkpoint (the interrupted step "
        "at most is lost)",
    )
    restart_s: float | None = Field(
        default=None,
        ge=0,
        le=MAX_SECONDS,
        description="the whole restart after a failure of this class (a spare's join included); "
        "None: the strategy's restart",
    )


def llama3_failure_mix(scale: float = 1.0) -> list[FailureClass]:
    """The Llama 3 Table 5 mix as rates per 1000 GPU-days (times ``scale``)."""
    exposure = LLAMA3_GPUS * LLAMA3_DAYS / 1000.0
    return [
        FailureClass(name=n, per_1000_gpu_days=scale * c / exposure, node_loss=nl, detect_s=d)
        for n, c, nl, d in LLAMA3_TABLE5
    ]


def llama3_planned_per_1000_gpu_days() -> float:
    return LLAMA3_PLANNED / (LLAMA3_GPUS * LLAMA3_DAYS / 1000.0)


class CheckpointTier(BaseModel):
    model_config = _FINITE

    name: str = Field(max_length=100)
    interval_s: float = Field(
        gt=0, le=MAX_SECONDS, description="training (compute) seconds between checkpoints"
    )
    stall_s: float = Field(ge=0, description="seconds the training loop is blocked per checkpoint")
    restore_s: float = Field(60.0, ge=0, description="seconds to load this tier on restart")
    persist_s: float = Field(
        0.0, ge=0, le=MAX_SECONDS, description="after the stall, until the checkpoint can be resumed from"
    )
    survives_node_loss: bool = True


Strategy = Literal["in_process", "in_job", "requeue", "replica"]


class SimConfig(BaseModel):
    """One simulated run. Times in seconds unless the name says otherwise."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    gpus: int = Field(LLAMA3_GPUS, gt=0, le=MAX_GPUS)
    gpus_per_node: int = Field(8, gt=0, le=1024)
    days: float = Field(LLAMA3_DAYS, gt=0, le=MAX_DAYS)
    trials: int = Field(1000, gt=0, le=MAX_TRIALS)
    seed: int = Field(0, ge=0, lt=2**63)
    failures: list[FailureClass] = Field(default_factory=llama3_failure_mix, max_length=MAX_FAILURE_CLASSES)
    planned_per_1000_gpu_days: float = Field(default_factory=llama3_planned_per_1000_gpu_days, ge=0)
    decide_s: float = Field(5.0, ge=0, description="policy decision after detection")
    tiers: list[CheckpointTier] = Field(
        default_factory=lambda: [
            CheckpointTier(name="shared_fs", interval_s=1800.0, stall_s=30.0, restore_s=300.0, persist_s=0.0)
        ]
    )
    strategy: Strategy = "in_job"
    in_process_restart_s: float = Field(60.0, ge=0)
    job_restart_s: float = Field(300.0, ge=0, description="re-rendezvous, re-init, warm-up")
    # False: failures strike only while training (chaos faults fire at steps), never during a recovery
    fail_in_recovery: bool = True
    # False: failures come between steps (chaos faults again), so never inside a save: one drawn there
    # comes when the save ends
    fail_in_save: bool = True
    startup_s: float | None = Field(
        None, ge=0, le=MAX_SECONDS, description="job start to first step; None: job_restart_s"
    )
    requeue_s: float = Field(1800.0, ge=0, description="back through the scheduler queue")
    spare_nodes: int | None = Field(
        None, ge=0, le=MAX_SPARES, description="hot spares; None: the wider pool always has a node"
    )
    repair_hours: float = Field(48.0, ge=0, description="a lost node returns to the pool after this")
    elastic: bool = False  # continue on fewer nodes when no spare is left
    min_nodes_fraction: float = Field(0.9, gt=0, le=1)
    straggler_per_node_day: float = Field(0.0, ge=0)
    straggler_slowdown: float = Field(0.0, ge=0, description="0.3 = steps 30% slower while it lasts")
    straggler_mitigate_s: float = Field(1800.0, ge=0)
    slow_steps: float = Field(
        0.0,
        ge=0,
        le=10,
        description="steps this much slower than the ideal step all run long (0.03 = 3%): a measured "
        "run's slowdown over its productive time, which a replay keeps",
    )
    gpu_hour_price: float = Field(2.0, ge=0)
    # the agent's own policies (sim/policies.py asks them; see docs/simulator.md)
    max_restarts: int | None = Field(
        None, ge=0, le=100_000, description="restart budget of the agent; None: a cluster manager restarts"
    )
    step_s: float | None = Field(
        None, gt=0, le=MAX_SECONDS, description="step time; hang classes are detected by the hang timeout"
    )
    # the agent's hang settings, the same model and defaults as `stalwart run` (settings/schema.py);
    # given flat as in a run's config (hang_floor_s, hang_cap_s, hang_multiplier)
    hang: HangSettings = HangSettings()  # frozen: one shared default instance
    # the run's cross-replica state check (settings/recovery.py): with step_s, the
    # silent_data_corruption class is found by it, half an interval after it strikes (sim/sdc.py)
    sdc: SdcSettings = SdcSettings()
    sdc_check_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_SECONDS,
        description="one cross-replica check, s (bench/sdc_overhead.py); with sdc.every 0 the "
        "interval is the one the budget allows at step_s",
    )
    size_rule: Literal["multiple", "power_of_two"] = "multiple"
    size_divisor: int = Field(1, ge=1, le=MAX_GPUS, description="world size must be a multiple of this")
    # replica-level fault tolerance (strategy "replica"): the job is this many replica groups; a failed
    # group drops out and rejoins after its recovery while the others keep training
    replica_groups: int = Field(8, ge=2, le=MAX_GPUS)
    # diagnosis quality, lemon nodes and their retirement, a spare's join time (sim/repair.py)
    repair: RepairPipeline = RepairPipeline()  # frozen: one shared default instance
    # state comes from a live replica at the failed step (in-place recovery): a failure loses only the
    # step it struck, never the work since the last checkpoint
    no_rollback: bool = False
    replica_rejoin_s: float = Field(
        5.0, ge=0, le=MAX_SECONDS, description="whole-job pause while a group leaves or rejoins (per step)"
    )

    @model_validator(mode="before")
    @classmethod
    # Any: pydantic's model_validator(mode='before') gets the raw input
    def _nest_flat_names(cls, data: Any) -> Any:
        return nest(data, _HANG_SETTINGS) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _check(self) -> SimConfig:
        if self.gpus % self.gpus_per_node:
            raise ConfigError(
                f"{self.gpus} GPUs is not a whole number of {self.gpus_per_node}-GPU nodes",
                "make --gpus a multiple of --gpus-per-node",
            )
        _check_tiers(self)
        if self.days * 86400.0 < min(t.interval_s for t in self.tiers):
            raise ConfigError(
                f"the run ({self.days:g} days) is shorter than one checkpoint interval "
                f"({min(t.interval_s for t in self.tiers):g} s)",
                "check the units: --days is days, intervals are seconds",
            )
        for f in self.failures:
            if not math.isfinite(f.per_1000_gpu_days):
                raise ConfigError(f"failure class {f.name} has a non-finite rate")
        _check_units(self)
        need = self.memory_estimate_bytes()
        if need > MAX_MEMORY_BYTES:
            raise ConfigError(
                f"{self.trials:,} trials need about {need / 2**30:.1f} GiB of memory "
                f"(at most {MAX_MEMORY_BYTES / 2**30:.0f} GiB)",
                "use fewer --trials; 1,000 already give percentiles to about 1%",
            )
        return self

    def memory_estimate_bytes(self) -> int:
        """The engine's working set: per trial ~20 float64 results plus the per-class counters; a
        bounded chunk of the trial x cycle matrix (~40 arrays of 128K cells); and, when the job may
        have to wait for a repaired node (finite spares, no shrinking), up to ~100 bytes per trial
        and cycle for the trials walked again (their draws kept from the first pass, the table of
        their losses, the waits so far)."""
        per_trial = self.trials * 8 * (20 + len(self.failures) + 1)
        chunk = 40 * (1 << 17) * 8
        waits = 0
        if self.spare_nodes is not None and not self.elastic and self.strategy != "replica":
            lam = self.failure_rate_per_s() + self.planned_rate_per_s()
            mu = lam * self.horizon_s
            waits = self.trials * int(mu + 8.0 * math.sqrt(mu) + 16) * 100
        return per_trial + chunk + waits

    @property
    def nodes(self) -> int:
        return self.gpus // self.gpus_per_node

    @property
    def horizon_s(self) -> float:
        return self.days * 86400.0

    def failure_rate_per_s(self) -> float:
        """Job failure rate (unplanned), per second of wall clock."""
        return sum(f.per_1000_gpu_days for f in self.failures) / 1000.0 * self.gpus / 86400.0

    def planned_rate_per_s(self) -> float:
        return self.planned_per_1000_gpu_days / 1000.0 * self.gpus / 86400.0


_HANG_SETTINGS = leaves(HangSettings, ("hang",))  # flat name (hang_floor_s) -> hang.floor_s
_SIM_LIMITS = {"multiplier": 1000.0, "floor_s": MAX_SECONDS, "cap_s": MAX_SECONDS}  # beyond: a unit mistake


def _check_tiers(cfg: SimConfig) -> None:
    if not cfg.tiers:
        raise ConfigError("at least one checkpoint tier is needed")
    if not any(t.survives_node_loss for t in cfg.tiers):
        raise ConfigError(
            "no checkpoint tier survives the loss of a node",
            "add a tier with survives_node_loss: true (shared FS, object store, peer copy)",
        )
    base = min(t.interval_s for t in cfg.tiers)
    for t in cfg.tiers:
        k = t.interval_s / base
        if abs(k - round(k)) > 1e-6:
            raise ConfigError(
                f"tier {t.name} interval {t.interval_s:g}s is not a multiple of the fastest tier's {base:g}s",
                "make every tier interval a multiple of the fastest",
            )
        if t.stall_s > 10.0 * t.interval_s:
            raise ConfigError(
                f"tier {t.name} stalls {t.stall_s:,.6g} s per checkpoint, more than ten times its "
                f"interval of {t.interval_s:,.6g} s of training",
                "check the units: interval_s and stall_s are both seconds",
            )
        if max(t.stall_s, t.restore_s) > MAX_SECONDS:
            raise ConfigError(
                f"tier {t.name}: stall/restore beyond any real run", "check the units (seconds)"
            )
    if max(t.interval_s for t in cfg.tiers) / base > 10_000:
        raise ConfigError("tier intervals differ by more than 10,000x", "check the units (seconds)")


def _check_units(cfg: SimConfig) -> None:
    """Times (and the hang multiplier) beyond any real run are a unit mistake."""
    for name in ("decide_s", "in_process_restart_s", "job_restart_s", "requeue_s", "straggler_mitigate_s"):
        if getattr(cfg, name) > MAX_SECONDS:
            raise ConfigError(f"{name} = {getattr(cfg, name):g} s is beyond any real run", "check the units")
    for field, limit in _SIM_LIMITS.items():
        value = getattr(cfg.hang, field)
        if value > limit:
            name = flat_name(("hang", field), _HANG_SETTINGS)
            raise ConfigError(
                f"{name} = {value:g} is beyond any real run (at most {limit:g})", "check the units"
            )


def make_config(**values: object) -> SimConfig:
    """Build a :class:`SimConfig`, turning pydantic's errors into one-line ConfigErrors."""

    try:
        return SimConfig(**values)  # type: ignore[arg-type]
    except ValidationError as exc:
        first = exc.errors()[0]
        where = flat_name(tuple(first.get("loc", ())), _HANG_SETTINGS) or "config"
        raise ConfigError(
            f"invalid simulator setting {where}: {first.get('msg')} (got {first.get('input')!r})",
            "rates and times must be finite and non-negative; GPUs, nodes, days and trials positive "
            "and within the limits in docs/simulator.md",
        ) from None
