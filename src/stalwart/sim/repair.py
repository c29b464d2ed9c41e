"""The repair pipeline: how well faults are diagnosed, lemon nodes and their retirement, and how long a
spare takes to join. Applied to a configuration as changed failure rates and recovery times
(:func:`effective`), so the engine itself is unchanged; the identity pipeline changes nothing.

* **Diagnosis quality.** A node-losing fault is pinned on the right node with probability
  ``diagnosis_accuracy``; otherwise a healthy node goes to repair and the faulty one stays in service
  and fails again, until it is diagnosed or retired. With accuracy p and retirement after k failures
  of a node, one fault brings (1 - (1 - p)^k) / p failures on average (a geometric series cut at k).
  A fault that leaves the node is blamed on it with probability ``false_repair``: a healthy node is
  sent to repair, a node loss as far as the job is concerned.
* **Lemons.** A share ``lemon_fraction`` of the nodes fails ``lemon_multiplier`` times as often as
  the rest (AIReSim's "bad nodes"; the 504-GPU production study saw 3 of 63 nodes give over half of
  the exclusions). Retiring a node after ``retire_after`` failures bounds what a lemon costs over the
  run: at most ``retire_after`` failures before a normal node replaces it.
* **Spares.** ``spare_join_s``: a spare that is not kept warm (processes started, CUDA up) spends
  this long joining after a node loss (boot, health check); 0 for warm standbys.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from .config import SimConfig

_FROZEN = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class RepairPipeline(BaseModel):
    """How lost nodes are diagnosed, repaired and replaced (the identity by default)."""

    model_config = _FROZEN

    diagnosis_accuracy: float = Field(
        default=1.0, gt=0, le=1, description="share of node faults pinned right"
    )
    false_repair: float = Field(default=0.0, ge=0, le=1, description="share of other faults blamed on a node")
    lemon_fraction: float = Field(default=0.0, ge=0, le=1, description="share of nodes that fail more often")
    lemon_multiplier: float = Field(
        default=1.0, ge=1, le=1e4, description="how much more often a lemon fails"
    )
    retire_after: int | None = Field(
        default=None, ge=1, le=1_000_000, description="retire a node after N failures"
    )
    spare_join_s: float = Field(default=0.0, ge=0, le=1e6, description="a spare's boot and health check, s")

    @property
    def identity(self) -> bool:
        return self == RepairPipeline()


def repeat_factor(p: RepairPipeline) -> float:
    """Failures per node-losing fault, misdiagnosed ones repeating until diagnosed or retired."""
    miss = 1.0 - p.diagnosis_accuracy
    if miss <= 0.0:
        return 1.0
    if p.retire_after is None:
        return 1.0 / p.diagnosis_accuracy
    return (1.0 - miss**p.retire_after) / p.diagnosis_accuracy


def lemon_factor(p: RepairPipeline, node_faults_per_node: float) -> float:
    """The fleet's node-fault rate over a normal node's: lemons fail ``lemon_multiplier`` times as
    often, but (retired after ``retire_after`` failures) no lemon fails more than that over the run;
    ``node_faults_per_node`` is a normal node's expected node faults over the run."""
    f, m = p.lemon_fraction, p.lemon_multiplier
    lemon = m * node_faults_per_node
    if p.retire_after is not None and lemon > p.retire_after:
        # the lemon fails ``retire_after`` times, then a normal node serves the rest of the run
        used = p.retire_after / m / max(node_faults_per_node, 1e-300)  # share of the run it served
        lemon = p.retire_after + (1.0 - used) * node_faults_per_node
    return (1.0 - f) + f * lemon / max(node_faults_per_node, 1e-300)


def effective(cfg: SimConfig) -> SimConfig:
    """``cfg`` with its repair pipeline folded into the failure classes (the spare's join time is the
    engine's, added to every node-loss recovery); ``cfg`` itself when the pipeline is the identity."""
    from .config import SimConfig  # deferred: cycle (stalwart.sim.config imports this one)

    p = cfg.repair
    if p.identity or (p.spare_join_s > 0 and p.model_copy(update={"spare_join_s": 0.0}).identity):
        return cfg
    node_rate = sum(f.per_1000_gpu_days for f in cfg.failures if f.node_loss) / 1000.0
    per_node_run = node_rate * cfg.gpus_per_node * cfg.days  # a normal node's node faults over the run
    scale = repeat_factor(p) * lemon_factor(p, per_node_run)
    classes = []
    for f in cfg.failures:
        if f.node_loss:
            classes.append(f.model_copy(update={"per_1000_gpu_days": f.per_1000_gpu_days * scale}))
            continue
        keep = f.per_1000_gpu_days * (1.0 - p.false_repair)
        classes.append(f.model_copy(update={"per_1000_gpu_days": keep}))
        if p.false_repair > 0:
            blamed = f.per_1000_gpu_days * p.false_repair * scale
            classes.append(
                f.model_copy(
                    update={"name": f"{f.name}_blamed_node", "per_1000_gpu_days": blamed, "node_loss": True}
                )
            )
    pipeline = RepairPipeline(spare_join_s=p.spare_join_s)
    return SimConfig(
        **{**cfg.model_dump(), "failures": [c.model_dump() for c in classes], "repair": pipeline.model_dump()}
    )
