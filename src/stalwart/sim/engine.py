"""Vectorised Monte Carlo of one training run, many trials at once (numpy).

Each loop iteration advances every trial by one interruption: a recovery phase (detection, decision,
restart, restore, waiting for nodes), which a further failure can interrupt, then a run phase until
the next failure or the end of the horizon. Failures are Poisson (superposed classes plus planned
maintenance), so the time to the next one is exponential and is redrawn at every phase boundary
(memorylessness). The run phase follows a periodic checkpoint schedule that restarts at every resume:
compute ``interval`` of the fastest tier, stall for every tier due at that point, repeat. A failure
rolls back to the newest completed checkpoint of a tier that survives it. Lost nodes go to repair and
come back after ``repair_hours``; hot spares replace them at no extra cost; without a spare the job
either shrinks (``elastic``) or waits for a repaired node.

Wall time of every trial is split into buckets that sum to the horizon: productive, degraded
(throughput lost to stragglers or a shrunk job), checkpoint stall, lost work (compute later rolled
back), detection + decision, restart + restore, waiting for nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError
from .config import SimConfig

BUCKETS = ("productive", "degraded", "ckpt_stall", "lost_work", "detect", "restart", "wait_nodes")


@dataclass(frozen=True)
class _Schedule:
    """The checkpoint schedule over one super-cycle (the longest tier interval)."""

    base: float  # fastest tier interval (compute seconds)
    period_compute: float  # longest interval
    stall_end: np.ndarray  # wall offset at the end of the m-th stall (m = 1..K)
    stall_cum: np.ndarray  # total stall up to and including the m-th (index 0 = 0)
    period_wall: float
    durable_every: int  # every how many base checkpoints a node-loss-surviving tier commits
    restore_all: float  # restore time of the fastest tier (software faults)
    restore_durable: float  # restore time of the fastest surviving tier (node loss)


def _schedule(cfg: SimConfig) -> _Schedule:
    base = min(t.interval_s for t in cfg.tiers)
    longest = max(t.interval_s for t in cfg.tiers)
    k = int(round(longest / base))
    stalls = np.zeros(k)
    for m in range(1, k + 1):
        stalls[m - 1] = sum(t.stall_s for t in cfg.tiers if m % int(round(t.interval_s / base)) == 0)
    cum = np.concatenate([[0.0], np.cumsum(stalls)])
    ends = base * np.arange(1, k + 1) + cum[1:]
    durable = [t for t in cfg.tiers if t.survives_node_loss]
    fastest_durable = min(durable, key=lambda t: t.interval_s)
    fastest = min(cfg.tiers, key=lambda t: t.interval_s)
    return _Schedule(
        base,
        longest,
        ends,
        cum,
        float(ends[-1]),
        int(round(fastest_durable.interval_s / base)),
        fastest.restore_s,
        fastest_durable.restore_s,
    )


@dataclass
class SimResult:
    """Per-trial outcomes (arrays of length ``trials``) plus the config that produced them."""

    config: SimConfig
    ettr: np.ndarray
    interruptions: np.ndarray
    planned: np.ndarray
    by_class: dict[str, np.ndarray]
    buckets: dict[str, np.ndarray]  # seconds
    iterations: int
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def lost_gpu_hours(self) -> np.ndarray:
        return (self.config.horizon_s - self.buckets["productive"]) * self.config.gpus / 3600.0

    @property
    def cost(self) -> np.ndarray:
        """Cost of the lost GPU-hours plus the reserved hot spares, per trial."""
        c = self.config
        spares_gpu_h = (c.spare_nodes or 0) * c.gpus_per_node * c.horizon_s / 3600.0
        return (self.lost_gpu_hours + spares_gpu_h) * c.gpu_hour_price

    def summary(self) -> dict[str, object]:
        def stats(a: np.ndarray) -> dict[str, float]:
            q = np.percentile(a, [5, 50, 95])
            return {"mean": float(a.mean()), "p5": float(q[0]), "p50": float(q[1]), "p95": float(q[2])}

        c = self.config
        return {
            "gpus": c.gpus,
            "nodes": c.nodes,
            "days": c.days,
            "trials": c.trials,
            "seed": c.seed,
            "strategy": c.strategy,
            "spare_nodes": c.spare_nodes,
            "elastic": c.elastic,
            "tiers": [t.model_dump() for t in c.tiers],
            "ettr": stats(self.ettr),
            "interruptions": stats(self.interruptions.astype(float)),
            "planned": stats(self.planned.astype(float)),
            "by_class_mean": {k: float(v.mean()) for k, v in self.by_class.items()},
            "lost_gpu_hours": stats(self.lost_gpu_hours),
            "cost": stats(self.cost),
            "currency_per_gpu_hour": c.gpu_hour_price,
            "buckets_hours_mean": {k: float(v.mean()) / 3600.0 for k, v in self.buckets.items()},
            "iterations": self.iterations,
        }


MAX_EXPECTED_INTERRUPTIONS = 100_000  # per trial; a year at 100k GPUs of the Llama-3 mix is ~20k


def simulate(cfg: SimConfig) -> SimResult:
    rng = np.random.default_rng(cfg.seed)
    n, horizon = cfg.trials, cfg.horizon_s
    sch = _schedule(cfg)

    classes = cfg.failures
    lam_fail = cfg.failure_rate_per_s()
    lam_plan = cfg.planned_rate_per_s()
    lam = lam_fail + lam_plan
    expected = lam * horizon
    if expected > MAX_EXPECTED_INTERRUPTIONS:
        raise ConfigError(
            f"{expected:,.0f} interruptions expected per trial ({lam * 3600:.3g} per hour for "
            f"{horizon / 86400:g} days); the simulator steps through each one and would not finish",
            "lower --gpus, --days or --rate-scale; rates measured on a chaos run are far above a real fleet's",
        )
    # class index 0..C-1 are failures, C is "planned"
    weights = np.array([f.per_1000_gpu_days for f in classes] + [cfg.planned_per_1000_gpu_days], float)
    cdf = np.cumsum(weights / weights.sum()) if lam > 0 else np.array([1.0])
    n_cls = len(classes)
    node_loss = np.array([f.node_loss for f in classes] + [False])
    detect = np.array([f.detect_s + cfg.decide_s for f in classes] + [0.0])

    if cfg.strategy == "in_process":
        soft_restart, hard_restart = cfg.in_process_restart_s, cfg.job_restart_s
    elif cfg.strategy == "in_job":
        soft_restart = hard_restart = cfg.job_restart_s
    else:
        soft_restart = hard_restart = cfg.requeue_s

    t = np.zeros(n)
    b = {k: np.zeros(n) for k in BUCKETS}
    counts = np.zeros((n, n_cls + 1), dtype=np.int64)
    # recovery needed before the next run phase: initial start-up is a plain job start
    recovery = np.full(n, cfg.job_restart_s + sch.restore_durable)
    mult = np.ones(n)  # throughput of the next run phase (elastic shrink)
    nodes = cfg.nodes
    cap = 16
    returns = np.full((n, cap), -np.inf)  # repair completion times of lost nodes
    strag_rate = cfg.straggler_per_node_day * nodes / 86400.0
    slow_loss = cfg.straggler_slowdown / (1.0 + cfg.straggler_slowdown)
    active = np.ones(n, dtype=bool)
    iterations = 0

    def draw_class(size: int) -> np.ndarray:
        return np.minimum(np.searchsorted(cdf, rng.random(size), side="right"), n_cls)

    def exp(size: int) -> np.ndarray:
        return rng.exponential(1.0 / lam, size) if lam > 0 else np.full(size, np.inf)

    while active.any():
        iterations += 1
        # ---- recovery phase (can itself be interrupted) -------------------------------------
        f1 = exp(n)
        rec = np.minimum(recovery, horizon - t)
        fail_in_rec = active & (f1 < rec)
        spent = np.where(fail_in_rec, f1, rec)
        b["restart"] += np.where(active, spent, 0.0)
        t = np.where(active, t + spent, t)
        done = active & ~fail_in_rec & (t >= horizon)
        active &= ~done
        # ---- run phase ----------------------------------------------------------------------
        run = active & ~fail_in_rec
        f2 = exp(n)
        x = np.where(run, np.minimum(f2, horizon - t), 0.0)
        fails_in_run = run & (f2 < horizon - t)
        q = np.floor(x / sch.period_wall)
        r = x - q * sch.period_wall
        j = np.searchsorted(sch.stall_end, r, side="right")  # completed stalls in this super-cycle
        compute_in = np.minimum(r - sch.stall_cum[j], (j + 1) * sch.base)
        compute = q * sch.period_compute + compute_in
        n_ckpt = q * len(sch.stall_end) + j  # completed base checkpoints
        # which class hit (drawn for every trial; used where a failure happened)
        cls = draw_class(n)
        hit = fail_in_rec | fails_in_run
        lost_node = hit & node_loss[cls]
        committed_all = n_ckpt * sch.base
        committed_durable = np.floor(n_ckpt / sch.durable_every) * sch.durable_every * sch.base
        planned = cls == n_cls
        kept = np.where(
            ~fails_in_run | planned, compute, np.where(lost_node, committed_durable, committed_all)
        )
        # stragglers: episodes during this run phase slow the whole job until mitigated
        if strag_rate > 0 and slow_loss > 0:
            episodes = rng.poisson(strag_rate * x)
            slow_frac = np.where(
                x > 0, np.minimum(x, episodes * cfg.straggler_mitigate_s) / np.maximum(x, 1e-9), 0
            )
            m = mult * (1.0 - slow_frac * slow_loss)
        else:
            m = mult
        b["productive"] += np.where(run, kept * m, 0.0)
        b["degraded"] += np.where(run, kept * (1.0 - m), 0.0)
        b["lost_work"] += np.where(run, compute - kept, 0.0)
        b["ckpt_stall"] += np.where(run, x - compute, 0.0)
        t = np.where(run, t + x, t)
        # ---- the interruption itself ---------------------------------------------------------
        counts[hit, cls[hit]] += 1
        det = np.where(hit, np.minimum(detect[cls], horizon - t), 0.0)
        b["detect"] += det
        t = t + det
        # lost nodes go to repair; spares replace them; otherwise shrink or wait
        wait = np.zeros(n)
        mult = np.where(hit, 1.0, mult)
        if lost_node.any() and cfg.spare_nodes is not None:
            if (np.min(returns, axis=1) > t).any():
                returns = np.concatenate([returns, np.full((n, cap), -np.inf)], axis=1)
                cap *= 2
            rows = np.nonzero(lost_node)[0]
            slot = np.argmin(returns[rows], axis=1)
            returns[rows, slot] = t[rows] + cfg.repair_hours * 3600.0
            out = (returns[rows] > t[rows, None]).sum(axis=1)
            missing = np.maximum(0, out - cfg.spare_nodes)
            short = missing > 0
            if short.any():
                r_rows = rows[short]
                miss = missing[short]
                allowed = cfg.elastic & (nodes - miss >= np.ceil(cfg.min_nodes_fraction * nodes))
                mult[r_rows[allowed]] = (nodes - miss[allowed]) / nodes
                w_rows, w_miss = r_rows[~allowed], miss[~allowed]
                if len(w_rows):
                    srt = np.sort(returns[w_rows], axis=1)  # ascending; the last `out` are pending
                    need = srt.shape[1] - (out[short][~allowed]) + w_miss - 1
                    wait[w_rows] = np.maximum(0.0, srt[np.arange(len(w_rows)), need] - t[w_rows])
        wait = np.where(hit, np.minimum(wait, horizon - t), 0.0)
        b["wait_nodes"] += wait
        t = t + wait
        restore = np.where(lost_node, sch.restore_durable, sch.restore_all)
        restart = np.where(lost_node, hard_restart, soft_restart)
        # a planned stop takes a checkpoint first (one stall of every tier) and loses no work
        plan_stall = sum(tr.stall_s for tr in cfg.tiers)
        recovery = np.where(hit, restart + restore + np.where(planned, plan_stall, 0.0), recovery)
        done = active & (t >= horizon)
        active &= ~done
        if iterations > 10_000_000:  # pragma: no cover - guards a runaway configuration
            break

    ettr = b["productive"] / horizon
    by_class = {f.name: counts[:, i] for i, f in enumerate(classes)}
    return SimResult(
        config=cfg,
        ettr=ettr,
        interruptions=counts[:, :n_cls].sum(axis=1),
        planned=counts[:, n_cls],
        by_class=by_class,
        buckets=b,
        iterations=iterations,
        extra={"job_failure_rate_per_h": lam_fail * 3600.0},
    )
