"""Planner: checkpoint interval per tier, spare count, restart strategy, ETTR and cost at scale.

Every recommendation starts from a closed form (Daly 2006 for intervals) and is then checked and
refined with the simulator, because the closed forms ignore detection latency, node loss, repair
queues and multi-tier restore. Each recommendation carries a one-line reason.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
from typing_extensions import assert_never

from ..account.ettr import daly_ettr, daly_interval
from .config import MAX_GPUS, CheckpointTier, SimConfig
from .engine import SimResult, simulate
from .options import OPTIONS, RecoveryOption, Target
from .sdc import SdcAdvice, advise, check_seconds
from .units import duration

__all__ = ["OPTIONS", "Plan", "RecoveryOption", "Target", "option_config", "plan"]

STRATEGIES = ("in_process", "in_job", "requeue")


PEER_RESTORE_S = 30.0  # loading state from a healthy peer's memory instead of shared storage


def option_config(cfg: SimConfig, option: str | RecoveryOption) -> SimConfig:
    """``cfg`` with one recovery option applied to its own flat times (no target job: the times the
    user gave); every option keeps ``cfg``'s hot spares except ``hot_spares`` (at least one per 256
    nodes, pre-initialised) and ``elastic`` (none: it shrinks). With a target job the options'
    phases come from their laws instead (``sim/options.py``)."""
    try:
        opt = RecoveryOption(option)
    except ValueError:
        raise ValueError(f"unknown recovery option {option!r}") from None
    match opt:
        case RecoveryOption.COLD:
            return _with(cfg, strategy="in_job")
        case RecoveryOption.WARM:
            return _with(cfg, strategy="in_process")
        case RecoveryOption.PEER:
            tiers = [
                {**t.model_dump(), "survives_node_loss": True, "restore_s": min(t.restore_s, PEER_RESTORE_S)}
                for t in cfg.tiers
            ]
            return _with(cfg, strategy="in_process", tiers=tiers)
        case RecoveryOption.IN_PLACE:  # a live replica's state: the peer's restore, and no rollback
            tiers = [
                {**t.model_dump(), "survives_node_loss": True, "restore_s": min(t.restore_s, PEER_RESTORE_S)}
                for t in cfg.tiers
            ]
            return _with(cfg, strategy="in_process", tiers=tiers, no_rollback=True)
        case RecoveryOption.REPLICA:
            return _with(cfg, strategy="replica")
        case RecoveryOption.HOT_SPARES:
            # a hot spare is already initialised: even a node loss costs only the in-place restart
            # (with no spare count, the pool always has a node: fewer hot spares would only add waits)
            n = None if cfg.spare_nodes is None else max(cfg.spare_nodes, math.ceil(cfg.nodes / 256))
            restart = min(cfg.in_process_restart_s, cfg.job_restart_s)
            return _with(cfg, strategy="in_process", spare_nodes=n, job_restart_s=restart, elastic=False)
        case RecoveryOption.ELASTIC:
            return _with(cfg, strategy="in_job", spare_nodes=0, elastic=True)
        case _:
            assert_never(opt)


@dataclass(frozen=True)
class TierAdvice:
    name: str
    current_s: float
    closed_form_s: float
    recommended_s: float
    reason: str


Row = dict[str, float | str]  # one row of a choice's table or of the options by size (JSON-ready)


@dataclass(frozen=True)
class Choice:
    value: object
    ettr: float
    cost: float
    reason: str
    table: tuple[Row, ...] = ()


@dataclass(frozen=True)
class ScalePoint:
    gpus: int
    spare_nodes: int | None
    job_mtbf_h: float
    interval_s: float
    ettr_mean: float
    ettr_p5: float
    interruptions_mean: float
    lost_gpu_hours_mean: float
    cost_mean: float
    wait_share: float = 0.0  # share of the wall clock spent waiting for a repaired node (spares all used)


@dataclass(frozen=True)
class Plan:
    tiers: tuple[TierAdvice, ...]
    tier_ettr: float
    spares: Choice
    strategy: Choice
    scale: tuple[ScalePoint, ...]
    sweep: tuple[dict[str, float], ...]  # ETTR against the durable interval (closed form + simulated)
    notes: tuple[str, ...] = field(default_factory=tuple)
    current_interval_s: float = 0.0
    options: tuple[Row, ...] = ()  # per recovery option and size: gpus, ettr (mean, p5, p95), cost
    phases: tuple[Row, ...] = ()  # per option at the plan's size: each phase, its seconds and source
    job: tuple[str, ...] = ()  # the target job, one line per figure with its source
    gpus: int = 0  # the plan's own size
    sdc: SdcAdvice | None = None  # how often replicas compare their state (with a target job)
    gpu_hour_price: float = 0.0  # what one GPU-hour costs: the unit of every cost, in its currency

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _sdc(target: Target, gpus: int, checkpoint_every_s: float) -> SdcAdvice:
    """The replica check's interval for the target job at ``gpus`` (``sim/sdc.py``)."""
    state = target.job.state_bytes_per_gpu(gpus).value
    return advise(
        check_seconds(state), target.job.step(gpus).value, gpus, checkpoint_every_s=checkpoint_every_s
    )


def _with(cfg: SimConfig, **changes: object) -> SimConfig:
    return SimConfig(**{**cfg.model_dump(), **changes})


def _rates(cfg: SimConfig) -> tuple[float, float]:
    """(all unplanned, node-losing) job failure rates per second."""
    per_s = cfg.gpus / 1000.0 / 86400.0
    lam = sum(f.per_1000_gpu_days for f in cfg.failures) * per_s
    lam_node = sum(f.per_1000_gpu_days for f in cfg.failures if f.node_loss) * per_s
    return lam, lam_node


def _mean_restart(cfg: SimConfig) -> float:
    """Average downtime per unplanned failure (detection + decision + restart + durable restore)."""
    lam, _ = _rates(cfg)
    if lam <= 0:
        return cfg.job_restart_s
    det = sum(f.per_1000_gpu_days * f.detect_s for f in cfg.failures) / sum(
        f.per_1000_gpu_days for f in cfg.failures
    )
    durable = min((t for t in cfg.tiers if t.survives_node_loss), key=lambda t: t.interval_s)
    return det + cfg.decide_s + cfg.job_restart_s + durable.restore_s


def closed_form_intervals(cfg: SimConfig) -> list[TierAdvice]:
    """Daly's optimum per tier: a durable tier against node-losing faults (against every fault when it is
    the only tier), a fast non-durable tier against the faults it survives; snapped to multiples."""
    lam, lam_node = _rates(cfg)
    lam_soft = lam - lam_node
    only_durable = all(t.survives_node_loss for t in cfg.tiers)
    raw: list[tuple[CheckpointTier, float, str]] = []
    for t in cfg.tiers:
        if t.survives_node_loss:
            rate = lam if only_durable else lam_node
            what = "every unplanned fault" if only_durable else "node-losing faults"
        else:
            rate, what = lam_soft, "faults that leave the node usable"
        if rate <= 0 or t.stall_s <= 0:
            raw.append(
                (t, t.interval_s, f"{t.name}: no {what} or no stall; keeping {duration(t.interval_s)}")
            )
            continue
        m = 1.0 / rate
        tau = daly_interval(t.stall_s, m)
        raw.append(
            (
                t,
                tau,
                f"{t.name}: Daly optimum for a {duration(t.stall_s)} stall against {what} "
                f"(job MTBF {duration(m)}) is {duration(tau)}",
            )
        )
    base = min(tau for _, tau, _ in raw)
    out = []
    for t, tau, why in raw:
        snapped = max(1, round(tau / base)) * base
        out.append(TierAdvice(t.name, t.interval_s, tau, snapped, why))
    return out


def _apply(cfg: SimConfig, intervals: Mapping[str, float]) -> SimConfig:
    tiers = [CheckpointTier(**{**t.model_dump(), "interval_s": intervals[t.name]}) for t in cfg.tiers]
    return _with(cfg, tiers=[t.model_dump() for t in tiers])


def _score(cfg: SimConfig) -> tuple[float, float, float]:
    r = simulate(cfg)
    return float(r.ettr.mean()), float(r.cost.mean()), float(r.interruptions.mean())


def _reoptimised(c: SimConfig) -> SimConfig:
    return _apply(c, {a.name: a.recommended_s for a in closed_form_intervals(c)})


def _option(c: SimConfig, opt: RecoveryOption | str, target: Target | None) -> SimConfig:
    """``c`` recovering by ``opt``: its phases at ``c``'s size (target job) or its flat times; with a
    target, the intervals are re-optimised for the option's own stall and restart."""
    if target is None:
        return option_config(c, opt)
    return _reoptimised(target.config(c, opt))


def _whole(gpus: int, per_node: int, target: Target | None) -> int:
    """``gpus`` rounded down to whole nodes and, for a target job, whole model-parallel groups."""
    return target.round(gpus, per_node) if target else max(per_node, gpus // per_node * per_node)


def _rounded(asked: Sequence[int], per_node: int, target: Target | None) -> list[str]:
    """A note for each size asked for (``--scale-to``) that is predicted at another size, or not at
    all, and why: a job runs on whole nodes and whole model-parallel groups."""
    unit = f"whole nodes of {per_node} GPUs"
    if target is not None:
        job = target.job
        why = job.size.why if job.model_parallel is None else "given"
        unit = f"whole model-parallel groups of {job.mp} GPUs ({why}) on {unit}"
    notes = []
    for g in sorted(set(asked)):
        if not per_node <= g <= MAX_GPUS:
            what = f"fewer GPUs than one node ({per_node})" if g < per_node else f"over {MAX_GPUS:,} GPUs"
            notes.append(f"--scale-to {g:,} is not predicted: {what}")
        elif (at := _whole(g, per_node, target)) != g:
            notes.append(f"--scale-to {g:,} is predicted at {at:,} GPUs: rounded down to {unit}")
    return notes


def _at_size(
    tuned: SimConfig,
    gpus: int,
    spare_candidates: Sequence[int],
    target: Target | None = None,
    chosen: str = RecoveryOption.COLD.value,
) -> tuple[SimConfig, SimResult]:
    """``tuned`` at ``gpus`` GPUs with the interval re-optimised and the spare count re-chosen by the
    same rule as at the run's own size (most productive GPU-hours per reserved GPU-hour). Scaling the
    spares in proportion is wrong for a small fleet: nodes in repair fluctuate like a Poisson count,
    so 2 spares for 128 nodes run out far more often than 32 for 2,048 and the job waits for repairs."""
    c = _with(tuned, gpus=gpus)
    c = _reoptimised(c if target is None else target.config(c, RecoveryOption.COLD))
    if tuned.spare_nodes is None:  # the wider pool always has a node
        c = c if target is None else _option(c, chosen, target)
        return c, simulate(c)
    scaled = math.ceil(tuned.spare_nodes * gpus / tuned.gpus)
    cands = sorted({*spare_candidates, *(math.ceil(scaled * f) for f in (0.5, 1.0, 1.5, 2.0, 3.0))})
    best: tuple[float, int, SimConfig, SimResult] | None = None
    for s in cands:
        cs = _with(c, spare_nodes=s)
        r = simulate(cs)
        per_reserved = round(float(r.ettr.mean()) * cs.gpus / (cs.gpus + s * cs.gpus_per_node), 4)
        if best is None or per_reserved > best[0]:
            best = (per_reserved, s, cs, r)
    assert best is not None
    if target is None or chosen == RecoveryOption.COLD.value:
        return best[2], best[3]
    # the spares are chosen for a job that must replace a lost node (cold); the chosen option keeps them
    c = _option(best[2], chosen, target)
    return c, simulate(c)


def plan(
    cfg: SimConfig,
    scale_to: Sequence[int] = (),
    trials: int = 200,
    spare_candidates: Sequence[int] = (0, 1, 2, 4, 8, 16, 32, 64),
    target: Target | None = None,
) -> Plan:
    """Intervals, spares and recovery for ``cfg``, and ETTR at other sizes. With a ``target`` job,
    every recovery's phases, the checkpoint's stall and the restores come from their laws at each
    size (``sim/options.py``); without one, from ``cfg``'s own times at every size."""
    cfg = _with(cfg, trials=min(cfg.trials, trials))
    notes: list[str] = []
    if target is not None:
        cfg = target.config(cfg, RecoveryOption.COLD)

    # 1. intervals: closed form, then a simulated search over a common scale factor
    advice = closed_form_intervals(cfg)
    best_factor, best = 1.0, -1.0
    for factor in (0.5, 0.7, 1.0, 1.4, 2.0):
        trial = _apply(cfg, {a.name: a.recommended_s * factor for a in advice})
        e, _, _ = _score(trial)
        if e > best + 1e-4:
            best, best_factor = e, factor
    tiers = tuple(
        TierAdvice(
            a.name,
            a.current_s,
            a.closed_form_s,
            a.recommended_s * best_factor,
            a.reason
            + (
                f"; the simulator prefers {best_factor:g}x that"
                if best_factor != 1.0
                else "; the simulator agrees"
            ),
        )
        for a in advice
    )
    tuned = _apply(cfg, {a.name: a.recommended_s for a in tiers})

    # 2. ETTR against the durable interval: closed form and simulated
    durable = min((t for t in tuned.tiers if t.survives_node_loss), key=lambda t: t.interval_s)
    lam, _ = _rates(tuned)
    restart = _mean_restart(tuned)
    sweep = []
    if lam > 0:
        single = _with(tuned, tiers=[durable.model_dump()])
        current = min(t.interval_s for t in cfg.tiers if t.survives_node_loss)
        taus = sorted({max(1.0, durable.interval_s * f) for f in (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)} | {current})
        for tau in taus:
            if tau > tuned.horizon_s:
                continue
            e, _, _ = _score(_apply(single, {durable.name: tau}))
            sweep.append(
                {
                    "interval_s": tau,
                    "ettr_sim": e,
                    "ettr_daly": daly_ettr(tau, durable.stall_s, restart, 1.0 / lam),
                }
            )
        notes.append(
            "Daly's curve assumes every fault restarts from the durable tier with the mean downtime "
            f"({duration(restart)}); the simulator also models detection per class and repair queues"
        )

    # 3. spares: most productive GPU-hours per reserved GPU-hour
    rows: list[Row] = []
    for s in spare_candidates:
        c = _with(tuned, spare_nodes=s)
        e, cost, _ = _score(c)
        per_reserved = e * c.gpus / (c.gpus + s * c.gpus_per_node)
        rows.append({"spares": s, "ettr": e, "cost": cost, "goodput_per_reserved_gpu": per_reserved})
    top = max(rows, key=lambda r: (round(float(r["goodput_per_reserved_gpu"]), 4), -int(r["spares"])))
    spares = Choice(
        top["spares"],
        float(top["ettr"]),
        float(top["cost"]),
        f"{top['spares']} hot spare nodes give the most productive GPU-hours per reserved GPU-hour "
        f"({float(top['goodput_per_reserved_gpu']):.3f}); repair takes {duration(tuned.repair_hours * 3600)}",
        tuple(rows),
    )
    tuned = _with(tuned, spare_nodes=int(top["spares"]))

    # 4. restart strategy (with a target job: the recovery option, from its phases)
    strategy = _strategy(tuned, target)
    chosen = str(strategy.value) if target is not None else RecoveryOption.COLD.value
    tuned = _with(tuned, strategy=str(strategy.value)) if target is None else tuned

    # 5. scale-up prediction, intervals re-optimised and spares re-chosen at every size; without
    # --scale-to, four sizes
    extra = [int(g) for g in scale_to] or [tuned.gpus // 16, tuned.gpus // 4, tuned.gpus * 4]
    sizes = sorted({tuned.gpus, *[g for g in extra if tuned.gpus_per_node <= g <= MAX_GPUS]})
    notes += _rounded([int(g) for g in scale_to], tuned.gpus_per_node, target)
    points = []
    options: list[Row] = []
    per = tuned.gpus_per_node
    for g in sorted({_whole(g, per, target) for g in sizes}):
        c, r = _at_size(tuned, g, spare_candidates, target, chosen)
        lam_g, _ = _rates(c)
        points.append(
            ScalePoint(
                gpus=g,
                spare_nodes=c.spare_nodes,
                job_mtbf_h=(1.0 / lam_g / 3600.0) if lam_g > 0 else math.inf,
                interval_s=min(t.interval_s for t in c.tiers if t.survives_node_loss),
                ettr_mean=float(r.ettr.mean()),
                ettr_p5=float(np.percentile(r.ettr, 5)),
                interruptions_mean=float(r.interruptions.mean()),
                lost_gpu_hours_mean=float(r.lost_gpu_hours.mean()),
                cost_mean=float(r.cost.mean()),
                wait_share=float(r.buckets["wait_nodes"].mean()) / c.horizon_s,
            )
        )
        # every option at this size draws the same failures (same seed and rate): common random numbers
        for opt in OPTIONS:
            ro = simulate(_option(c, opt, target))
            lo, hi = np.percentile(ro.ettr, [5, 95])
            options.append(
                {
                    "option": opt,
                    "gpus": g,
                    "ettr": float(ro.ettr.mean()),
                    "ettr_p5": float(lo),
                    "ettr_p95": float(hi),
                    "cost": float(ro.cost.mean()),
                }
            )
    current = min(t.interval_s for t in cfg.tiers if t.survives_node_loss)
    phases = _phase_rows(target, cfg.gpus) if target is not None else ()
    job = tuple(target.job.describe(cfg.gpus)) if target is not None else ()
    sdc = _sdc(target, cfg.gpus, min(t.recommended_s for t in tiers)) if target is not None else None
    return Plan(
        tiers,
        best,
        spares,
        strategy,
        tuple(points),
        tuple(sweep),
        tuple(notes),
        current,
        tuple(options),
        phases,
        job,
        cfg.gpus,
        sdc,
        cfg.gpu_hour_price,
    )


def _strategy(tuned: SimConfig, target: Target | None) -> Choice:
    """The restart strategy (flat times) or, with a target job, the recovery option with the best
    ETTR at the plan's size, its phases from their laws."""
    rows: list[Row] = []
    if target is None:
        for strat in STRATEGIES:
            e, cost, _ = _score(_with(tuned, strategy=strat))
            rows.append({"strategy": strat, "ettr": e, "cost": cost})
    else:
        for opt in OPTIONS:
            e, cost, _ = _score(_option(tuned, opt, target))
            rows.append({"strategy": opt, "ettr": e, "cost": cost})
    best = max(rows, key=lambda r: float(r["ettr"]))
    worst = min(rows, key=lambda r: float(r["ettr"]))
    if target is None:
        times = (
            f"(restart {duration(min(tuned.in_process_restart_s, tuned.job_restart_s))} / "
            f"{duration(tuned.job_restart_s)} / {duration(tuned.requeue_s)})"
        )
    else:
        totals = {o: target.costs(o, tuned.gpus) for o in (str(best["strategy"]), str(worst["strategy"]))}
        times = (
            "(recovery after a node loss "
            + " / ".join(f"{duration(c.total(c.hard) + c.restore_hard.value)}" for c in totals.values())
            + ", from their phases)"
        )
    return Choice(
        best["strategy"],
        float(best["ettr"]),
        float(best["cost"]),
        f"{best['strategy']} gives ETTR {float(best['ettr']):.3f} against {float(worst['ettr']):.3f} for "
        f"{worst['strategy']} {times}",
        tuple(rows),
    )


def _phase_rows(target: Target, gpus: int) -> tuple[Row, ...]:
    """Every option's phases at ``gpus`` GPUs: after a fault that leaves the node and after a node
    loss, the restores, the checkpoint's stall and persist; each with its seconds and source."""
    rows: list[Row] = []
    for opt in OPTIONS:
        c = target.costs(opt, gpus)
        parts = [("soft", n, f) for n, f in c.soft] + [("node_loss", n, f) for n, f in c.hard]
        parts += [("soft", "restore", c.restore_soft), ("node_loss", "restore", c.restore_hard)]
        parts += [("rejoin", n, f) for n, f in c.rejoin]
        parts += [("checkpoint", "stall", c.stall), ("checkpoint", "persist", c.persist)]
        for when, name, f in parts:
            rows.append(
                {
                    "option": opt,
                    "when": when,
                    "phase": name,
                    "seconds": f.value,
                    "source": str(f.source),
                    "note": f.note,
                }
            )
    return tuple(rows)
