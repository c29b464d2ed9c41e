"""Recovery options by their mechanism: which phases each one pays at the target size.

* ``cold``: every process restarts (tear down, process start, CUDA, rendezvous, process group at the
  job's size, state from storage, first step);
* ``warm``: workers forked from a pre-imported server (no imports), state from the node's memory
  after a fault that leaves the node, from storage after a node loss (the replacement starts cold);
* ``peer``: warm, and a replacement node reads the state from a peer's memory over the network;
* ``in_place``: survivors keep their processes and CUDA contexts; the process group is aborted and
  re-formed; only a replacement starts, alongside the abort; state comes from a live replica over
  the network, so a failure loses only the step it struck (FlashRecovery, DeadPool, HyperPod
  checkpointless training work this way);
* ``replica``: the failed replica group drops out and the others train on at a reduced batch; the
  group restarts warm at its own size, takes the state from a live replica, and every rejoin pauses
  the job for a process group across the groups;
* ``hot_spares``: warm, with pre-initialised spare nodes (processes and CUDA up) for node losses;
* ``elastic``: cold, with no spares: the job shrinks instead of waiting for a repaired node.

Every cost is a :class:`~stalwart.sim.laws.Figure`: its value, where it came from and why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from typing_extensions import assert_never

from ..policy.label import Label
from .config import CheckpointTier, SimConfig
from .job import TargetJob
from .laws import Figure, Source
from .phases import Laws


class RecoveryOption(Label):
    """The recovery options compared at every size; the values name them in the plan's JSON and tables."""

    COLD = "cold"
    WARM = "warm"
    PEER = "peer"
    IN_PLACE = "in_place"
    REPLICA = "replica"
    HOT_SPARES = "hot_spares"
    ELASTIC = "elastic"


OPTIONS = tuple(o.value for o in RecoveryOption)
Phases = tuple[tuple[str, Figure], ...]  # (phase, figure) in order


@dataclass(frozen=True)
class OptionCosts:
    """One option at one size: the recovery after a fault that leaves the node (``soft``), after a
    node loss (``hard``), the restores, the first start, and the checkpoint's stall and persist."""

    option: RecoveryOption
    gpus: int
    soft: Phases
    hard: Phases
    restore_soft: Figure
    restore_hard: Figure
    startup: Phases
    stall: Figure
    persist: Figure
    rejoin: Phases = ()  # replica: the whole job's pause while a group leaves or rejoins
    groups: int = 0  # replica: how many groups the job is

    @staticmethod
    def total(phases: Phases) -> float:
        return sum(f.value for _, f in phases)


def _first_step(laws: Laws, job: TargetJob, gpus: int) -> Figure:
    ratio = laws.first_step_ratio.at(gpus)
    step = job.step(gpus)
    return Figure(
        ratio.value * step.value, step.source, f"{ratio.value:.2g} steps ({ratio.note}); step: {step.note}"
    )


def _start(laws: Laws, job: TargetJob, gpus: int, forked: bool) -> Phases:
    """A fresh (or forked) worker up to its process group at ``gpus`` ranks."""
    proc = ("fork", laws.fork.at(gpus)) if forked else ("spawn", laws.spawn.at(gpus))
    cuda = Figure(
        job.cuda_init_s,
        Source.GIVEN if "cuda_init_s" in job.model_fields_set else Source.DEFAULT,
        "CUDA context and library handles of a fresh process",
    )
    return (
        proc,
        ("cuda_init", cuda),
        ("rendezvous", laws.rendezvous.at(gpus)),
        ("pg_init", laws.pg_init.at(gpus)),
    )


def option_costs(option: RecoveryOption | str, laws: Laws, job: TargetJob, gpus: int) -> OptionCosts:
    """The phases ``option`` pays at ``gpus`` GPUs."""
    opt = RecoveryOption(option)
    job.check(gpus)
    tear = ("tear_down", laws.tear_down.at(gpus))
    first = ("first_step", _first_step(laws, job, gpus))
    storage = job.load_storage(gpus)
    stall, persist = job.staging(gpus), job.persist()
    cold_start = _start(laws, job, gpus, forked=False)
    startup = (*cold_start, first)
    match opt:
        case RecoveryOption.COLD | RecoveryOption.ELASTIC:
            soft = hard = (tear, *cold_start, first)
            return OptionCosts(opt, gpus, soft, hard, storage, storage, startup, stall, persist)
        case RecoveryOption.WARM | RecoveryOption.PEER | RecoveryOption.HOT_SPARES:
            soft = (tear, *_start(laws, job, gpus, forked=True), first)
            hard = soft if opt is RecoveryOption.HOT_SPARES else (tear, *cold_start, first)
            local = job.load_host(gpus)
            away = job.load_network(gpus, "from a peer's memory") if opt is RecoveryOption.PEER else storage
            return OptionCosts(opt, gpus, soft, hard, local, away, startup, stall, persist)
        case RecoveryOption.IN_PLACE:
            abort = ("abort", laws.abort.at(gpus))
            rdzv = ("rendezvous", laws.inplace_rendezvous.at(gpus))
            pg = ("pg_init", laws.inplace_pg_init.at(gpus))
            soft = (abort, rdzv, pg, first)
            # the replacement starts while the survivors abort: the longer of the two
            repl = OptionCosts.total(cold_start[:2])
            wait = (
                abort[1]
                if abort[1].value >= repl
                else Figure(
                    repl, Source.FITTED, "a replacement's process start and CUDA set-up, alongside the abort"
                )
            )
            hard = (("abort_or_replacement", wait), rdzv, pg, first)
            live = job.load_network(gpus, "from a live replica")
            return OptionCosts(opt, gpus, soft, hard, live, live, startup, stall, persist)
        case RecoveryOption.REPLICA:
            group = max(1, gpus // job.replica_groups)
            soft = hard = (tear, *_start(laws, job, group, forked=True), first)
            live = job.load_network(gpus, "from a live replica")
            rejoin = (
                ("rendezvous", laws.inplace_rendezvous.at(job.replica_groups)),
                ("pg_init", laws.inplace_pg_init.at(job.replica_groups)),
            )
            return OptionCosts(
                opt, gpus, soft, hard, live, live, startup, stall, persist, rejoin, job.replica_groups
            )
        case _:
            assert_never(opt)


@dataclass(frozen=True)
class Target:
    """What a plan is for: the job, and the laws its recovery phases follow at every size."""

    job: TargetJob
    laws: Laws

    def costs(self, option: RecoveryOption | str, gpus: int) -> OptionCosts:
        return option_costs(option, self.laws, self.job, gpus)

    def config(self, cfg: SimConfig, option: RecoveryOption | str) -> SimConfig:
        """``cfg`` (at its own size) recovering by ``option`` with the phases at that size."""
        return apply(cfg, self.costs(option, cfg.gpus))

    def round(self, gpus: int, per_node: int) -> int:
        """``gpus`` rounded down to whole nodes and whole model-parallel groups (at least one)."""
        unit = math.lcm(per_node, self.job.mp)
        return max(unit, gpus // unit * unit) if gpus >= unit else max(per_node, gpus // per_node * per_node)


def apply(cfg: SimConfig, c: OptionCosts) -> SimConfig:
    """``cfg`` recovering by ``c``'s mechanism: its restart and restore times, its checkpoint tiers
    (the durable interval kept), its strategy and spares."""
    durable = min((t for t in cfg.tiers if t.survives_node_loss), key=lambda t: t.interval_s)
    # the interval is a seed the planner re-optimises for this stall; a small run's interval can be
    # shorter than the target job's stall, and no interval shorter than one stall is a real schedule
    interval = max(durable.interval_s, c.stall.value)
    base = {"interval_s": interval, "stall_s": c.stall.value, "persist_s": c.persist.value}
    tiers: list[dict[str, object]] = []
    opt = c.option
    if opt in (RecoveryOption.WARM, RecoveryOption.PEER, RecoveryOption.HOT_SPARES):
        # the staged copy in host memory is the fast tier; storage is written from it behind the loop
        tiers.append(
            {
                **base,
                "name": "memory",
                "restore_s": c.restore_soft.value,
                "persist_s": 0.0,
                "survives_node_loss": opt is RecoveryOption.PEER,
            }
        )
        if opt is RecoveryOption.PEER:
            tiers[-1]["restore_s"] = c.restore_hard.value
        tiers.append({**base, "name": "storage", "stall_s": 0.0, "restore_s": c.restore_hard.value})
    else:
        tiers.append({**base, "name": "storage", "restore_s": c.restore_hard.value})
    values = cfg.model_dump()
    soft, hard = OptionCosts.total(c.soft), OptionCosts.total(c.hard)
    start = OptionCosts.total(c.startup)
    values.update(
        tiers=[CheckpointTier(**t).model_dump() for t in tiers],  # type: ignore[arg-type]
        in_process_restart_s=soft,
        job_restart_s=hard,
        startup_s=start,
        no_rollback=False,
    )
    match opt:
        case RecoveryOption.COLD:
            values.update(strategy="in_job")
        case RecoveryOption.ELASTIC:
            values.update(strategy="in_job", spare_nodes=0, elastic=True)
        case RecoveryOption.WARM | RecoveryOption.PEER:
            values.update(strategy="in_process")
        case RecoveryOption.HOT_SPARES:
            n = None if cfg.spare_nodes is None else max(cfg.spare_nodes, math.ceil(cfg.nodes / 256))
            values.update(strategy="in_process", spare_nodes=n, elastic=False)
        case RecoveryOption.IN_PLACE:
            # the restore is the live replica's transfer; no rollback to a checkpoint
            values.update(strategy="in_process", no_rollback=True)
            values["tiers"][0]["restore_s"] = c.restore_soft.value
        case RecoveryOption.REPLICA:
            values.update(
                strategy="replica",
                replica_groups=c.groups,
                replica_rejoin_s=OptionCosts.total(c.rejoin),
            )
            values["tiers"][0]["restore_s"] = c.restore_soft.value
        case _:
            assert_never(opt)
    return SimConfig(**values)
