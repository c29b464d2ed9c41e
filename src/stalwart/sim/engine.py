"""Vectorised Monte Carlo of one training run, many trials at once (numpy).

A trial is a sequence of *cycles*. A cycle starts when the job begins to recover (or to start) and
ends when the next failure has been detected and, if it cost a node, the job has a node to run on:

    recovery (restart, restore)  ->  run (compute, checkpoint stalls)  ->  failure  ->  detection
    ->  wait for a node (only when no spare is left and the job cannot shrink)

Failures are Poisson (superposed classes plus planned maintenance), so the time from a cycle's start
to its failure is one exponential draw; a failure during the recovery interrupts it (no run phase).
Because the draws do not depend on the state, every cycle of every trial is drawn at once as a
(trials x cycles) matrix and the buckets are sums over it; the only state that carries between
cycles is the repair queue (nodes in repair, hot spares, elastic shrink). It is computed from the
failure times with a vectorised sliding window; a trial whose job ever has to wait for a repaired
node (which moves every later failure) is recomputed cycle by cycle, for those trials only.

The run phase follows a periodic checkpoint schedule that restarts at every resume: compute
``interval`` of the fastest tier, stall for every tier due at that point, repeat. A failure rolls back
to the newest completed checkpoint of a tier that survives it.

Policies are the agent's own (``sim/policies.py``): the restart budget, the hang timeout and the
world-size / spare choice. Time is booked into the report's bucket names (``sim/buckets.py``).
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import ConfigError
from ..policy.restart_policy import RestartBudget
from ..policy.timeouts import HangTimeoutPolicy
from ..policy.world_size import SizeRule
from .buckets import SIM_BUCKETS
from .config import SimConfig
from .policies import WorldSizer, hang_detect_s, restart_backoff, restart_period
from .repair_queue import repair_queue, sequential_waits

BUCKETS = SIM_BUCKETS
CHUNK_CELLS = 1 << 17  # trials x cycles per chunk: arrays of 0.5-1 MiB that stay in the CPU cache
MAX_WORKERS = 8  # threads over the chunks (numpy's loops run without the GIL)
BACKOFF_PASSES = 64  # the longest streak of failures without progress that back-off alone makes


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
    persist: float  # background persist of the fastest surviving tier


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
        fastest_durable.persist_s,
    )


@dataclass
class SimResult:
    """Per-trial outcomes (arrays of length ``trials``) plus the config that produced them."""

    config: SimConfig
    ettr: np.ndarray
    interruptions: np.ndarray
    planned: np.ndarray
    by_class: dict[str, np.ndarray]
    buckets: dict[str, np.ndarray]  # seconds, SIM_BUCKETS
    iterations: int
    extra: dict[str, float] = field(default_factory=dict)
    trace: list[dict[str, float]] = field(default_factory=list)  # trial 0, cycle by cycle (trace=True)

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


# above this many trials x cycles, per-cycle quantities are float32 (a few ms per cycle; times and sums
# stay float64): half the memory traffic. Smaller runs and traced ones are float64 throughout.
FLOAT32_CELLS = 1 << 22
MAX_EXPECTED_INTERRUPTIONS = 100_000  # per trial; a year at 100k GPUs of the Llama-3 mix is ~20k


@dataclass(frozen=True)
class _Model:
    """Everything per failure class, with the policies' answers folded in."""

    lam: float
    cdf: np.ndarray
    alias_p: np.ndarray  # Walker's alias table over the classes (+ planned): one uniform per draw
    alias_i: np.ndarray
    n_cls: int
    node_loss: np.ndarray  # per class (+ planned)
    detect: np.ndarray  # detection + decision per class
    restart: np.ndarray  # restart after a failure of this class
    restore: np.ndarray
    plan_stall: np.ndarray  # the checkpoint a planned stop takes (counted into the next recovery)
    first: tuple[float, float]  # (start-up, restore) of the first cycle
    requeue: tuple[float, float]  # (requeue, restore) after the restart budget ran out
    period: int | None  # infra failures after which the agent's restart policy stops the job
    backoff: np.ndarray | None  # the agent's wait after s failures in a row without progress (index s)
    sizer: WorldSizer | None
    repair_s: float
    replica: bool
    ft: type = np.float64  # dtype of per-cycle quantities


def _model(cfg: SimConfig, sch: _Schedule) -> _Model:
    classes = cfg.failures
    lam = cfg.failure_rate_per_s() + cfg.planned_rate_per_s()
    weights = np.array([f.per_1000_gpu_days for f in classes] + [cfg.planned_per_1000_gpu_days], float)
    cdf = np.cumsum(weights / weights.sum()) if lam > 0 else np.array([1.0])
    n_cls = len(classes)
    node_loss = np.array([f.node_loss for f in classes] + [False])
    hang_s = None
    if cfg.step_s is not None:
        policy = HangTimeoutPolicy(
            multiplier=cfg.hang_multiplier,
            floor_s=cfg.hang_floor_s,
            cap_s=max(cfg.hang_cap_s, cfg.hang_floor_s),
        )
        hang_s = hang_detect_s(cfg.step_s, policy)
    detect = np.array(
        [(hang_s if f.kind == "hang" and hang_s is not None else f.detect_s) + cfg.decide_s for f in classes]
        + [0.0]
    )
    if cfg.strategy == "in_process":
        # restarting in place skips work a job restart does, so it is never slower than one (a measured
        # job restart of 0.5 s must not be beaten by the 60 s default guess for an in-place restart)
        soft, hard = min(cfg.in_process_restart_s, cfg.job_restart_s), cfg.job_restart_s
    elif cfg.strategy == "requeue":
        soft = hard = cfg.requeue_s
    else:  # in_job; replica: the failed group restarts like a job, from a peer replica's memory
        soft = hard = cfg.job_restart_s
    restart = np.where(node_loss, hard, soft)
    if cfg.strategy == "replica":
        restore = np.full(n_cls + 1, sch.restore_all)
    else:
        restore = np.where(node_loss, sch.restore_durable, sch.restore_all)
    plan_stall = np.zeros(n_cls + 1)
    plan_stall[n_cls] = sum(t.stall_s for t in cfg.tiers)
    sizer = None
    if cfg.spare_nodes is not None:
        min_nodes = math.ceil(cfg.min_nodes_fraction * cfg.nodes) if cfg.elastic else cfg.nodes
        rule = SizeRule(
            "power_of_two" if cfg.size_rule == "power_of_two" else "multiple",
            cfg.size_divisor,
        )
        sizer = WorldSizer(cfg.nodes, cfg.spare_nodes, cfg.gpus_per_node, max(1, min_nodes), rule)
        if not sizer.share(0)[0] or sizer.initial_share < 1.0:
            raise ConfigError(
                f"{cfg.gpus:,} GPUs is not a valid world size under the size rule "
                f"({cfg.size_rule}, divisor {cfg.size_divisor})",
                "pick --gpus that the rule allows, or relax the size rule",
            )
    budget = None if cfg.max_restarts is None else RestartBudget(max_restarts=cfg.max_restarts)
    alias_p, alias_i = _alias(weights if lam > 0 else np.array([0.0] * n_cls + [1.0]))
    return _Model(
        lam=lam,
        cdf=cdf,
        alias_p=alias_p,
        alias_i=alias_i,
        n_cls=n_cls,
        node_loss=node_loss,
        detect=detect,
        restart=restart,
        restore=restore,
        plan_stall=plan_stall,
        first=(cfg.job_restart_s if cfg.startup_s is None else cfg.startup_s, sch.restore_durable),
        requeue=(cfg.requeue_s, sch.restore_durable),
        period=restart_period(budget),
        backoff=restart_backoff(budget) if cfg.fail_in_recovery else None,  # else every attempt progresses
        sizer=sizer,
        repair_s=cfg.repair_hours * 3600.0,
        replica=cfg.strategy == "replica",
    )


def _alias(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vose's alias table: draw slot k uniformly, keep it with probability p[k], else take i[k]."""
    n = len(weights)
    q = weights / weights.sum() * n
    p = np.ones(n)
    i = np.arange(n, dtype=np.int16)
    small = [k for k in range(n) if q[k] < 1.0]
    large = [k for k in range(n) if q[k] >= 1.0]
    while small and large:
        s, g = small.pop(), large.pop()
        p[s], i[s] = q[s], g
        q[g] -= 1.0 - q[s]
        (small if q[g] < 1.0 else large).append(g)
    return p, i


def _cycles(lam: float, horizon: float) -> int:
    """Cycles per trial that are enough with overwhelming probability (checked after the fact)."""
    if lam <= 0:
        return 1
    mu = lam * horizon
    return int(mu + 8.0 * math.sqrt(mu) + 16)


def _workers() -> int:
    """Threads for the chunks: numpy releases the GIL in its array loops, so chunks run in parallel."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        n = os.cpu_count() or 1
    return max(1, min(n, MAX_WORKERS))


def _in_parallel(fn, items: list, workers: int) -> list:
    """``[fn(x) for x in items]``, spread over ``workers`` threads (results in order)."""
    if workers <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items))) as ex:
        return list(ex.map(fn, items))


def simulate(cfg: SimConfig, *, trace: bool = False, workers: int | None = None) -> SimResult:
    """Every trial of ``cfg``; ``workers`` threads share the chunks (default: the CPUs this process
    may use, at most ``MAX_WORKERS``). Each chunk draws from its own stream of the seed, so the result
    does not depend on the number of threads."""
    horizon = cfg.horizon_s
    sch = _schedule(cfg)
    m = _model(cfg, sch)
    expected = m.lam * horizon
    if expected > MAX_EXPECTED_INTERRUPTIONS:
        raise ConfigError(
            f"{expected:,.0f} interruptions expected per trial ({m.lam * 3600:.3g} per hour for "
            f"{horizon / 86400:g} days); that is not a training run any policy could make progress in",
            "check the rates' units (per 1000 GPU-days) and --gpus/--days",
        )
    k = _cycles(m.lam, horizon)
    n = cfg.trials
    if not trace and n * k > FLOAT32_CELLS:
        f = np.float32
        m = replace(
            m,
            detect=m.detect.astype(f),
            restart=m.restart.astype(f),
            restore=m.restore.astype(f),
            plan_stall=m.plan_stall.astype(f),
            ft=f,
        )
    threads = _workers() if workers is None else max(1, workers)
    out_b = {b: np.zeros(n) for b in BUCKETS}
    counts = np.zeros((n, m.n_cls + 1), dtype=np.int64)
    rows_per_chunk = max(1, CHUNK_CELLS // k)
    tr: list[dict[str, float]] = []
    chunks = [(lo, min(n, lo + rows_per_chunk)) for lo in range(0, n, rows_per_chunk)]
    streams = np.random.SeedSequence(cfg.seed).spawn(len(chunks) + 1)  # the last: deferred trials

    def store(
        rows: np.ndarray, res: tuple[dict[str, np.ndarray], np.ndarray, list[dict[str, float]]]
    ) -> None:
        nonlocal tr
        b, c, t0 = res
        for name in BUCKETS:
            out_b[name][rows] = b[name]  # chunks hold disjoint rows: threads never write the same cell
        counts[rows] = c
        if t0:
            tr = t0

    def run_chunk(i: int) -> tuple[int, np.ndarray, np.ndarray, np.ndarray] | None:
        """Simulate chunk ``i``; returns the trials that waited for a repaired node, for a second pass."""
        lo, hi = chunks[i]
        rng = np.random.default_rng(streams[i])
        kk = k
        while True:
            e, cls = _draw(m, rng, hi - lo, kk)
            e = _fail_at(cfg, sch, m, e, cls)  # from here on: offset of the failure from the cycle's start
            det = m.detect[cls]
            end = np.cumsum(e + det, axis=1, dtype=np.float64)  # when each cycle ends, without waits
            if (end[:, -1] >= horizon).all():
                break
            kk *= 2  # some trial did not reach the horizon in kk cycles: draw more (rare)
        rows = np.arange(lo, hi)
        share, must = _queue(cfg, m, e, det, cls, end)
        waited = None
        if must.any():  # these trials waited for a repaired node: every later cycle moves
            waited = (kk, rows[must], e[must], cls[must])
            keep = ~must
            rows, e, det, cls, end = rows[keep], e[keep], det[keep], cls[keep], end[keep]
            share = share[keep] if share is not None else None
        if len(rows):
            store(rows, _finish(cfg, sch, m, rng, e, det, cls, None, share, end, trace and rows[0] == 0))
        return waited

    deferred: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}  # width -> (rows, e, cls)
    for part in _in_parallel(run_chunk, list(range(len(chunks))), threads):
        if part is not None:
            deferred.setdefault(part[0], []).append(part[1:])
    passes = 2 if deferred else 1
    jobs: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    for parts in deferred.values():
        rows = np.concatenate([p[0] for p in parts])
        e = np.concatenate([p[1] for p in parts])
        cls = np.concatenate([p[2] for p in parts])
        det = m.detect[cls]
        # the cycle-by-cycle walk costs per cycle, not per trial: split the trials between the threads
        # (slices, not index arrays: no copy of the trials' cycles)
        bounds = np.linspace(0, len(rows), min(threads, len(rows)) + 1).astype(int)
        cuts = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

        def walk(ix: slice, e=e, det=det, cls=cls) -> tuple[np.ndarray, np.ndarray]:
            return sequential_waits(
                m.sizer, m.repair_s, cfg.spare_nodes or 0, horizon, e[ix], det[ix], m.node_loss[cls[ix]]
            )

        walked = _in_parallel(walk, cuts, threads)
        wait = np.concatenate([w for w, _ in walked])
        share = np.concatenate([s for _, s in walked])
        for lo in range(0, len(rows), rows_per_chunk):
            sl = slice(lo, lo + rows_per_chunk)
            jobs.append((rows[sl], e[sl], det[sl], cls[sl], wait[sl], share[sl]))
    fin_streams = streams[-1].spawn(len(jobs)) if jobs else []

    def finish_deferred(j: int) -> None:
        rows, e, det, cls, wait, share = jobs[j]
        rng = np.random.default_rng(fin_streams[j])
        store(rows, _finish(cfg, sch, m, rng, e, det, cls, wait, share, None, trace and rows[0] == 0))

    _in_parallel(finish_deferred, list(range(len(jobs))), threads)
    ettr = out_b["productive"] / horizon
    return SimResult(
        config=cfg,
        ettr=ettr,
        interruptions=counts[:, : m.n_cls].sum(axis=1),
        planned=counts[:, m.n_cls],
        by_class={f.name: counts[:, i] for i, f in enumerate(cfg.failures)},
        buckets=out_b,
        iterations=passes,
        extra={"job_failure_rate_per_h": cfg.failure_rate_per_s() * 3600.0},
        trace=tr,
    )


def _draw(m: _Model, rng: np.random.Generator, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """Time from each cycle's start to its failure, and the failure's class (n_cls = planned)."""
    if m.lam <= 0:
        return np.full((rows, cols), np.inf, dtype=m.ft), np.full((rows, cols), m.n_cls, dtype=np.int16)
    e = rng.standard_exponential((rows, cols), dtype=m.ft)
    e *= 1.0 / m.lam
    u = rng.random((rows, cols), dtype=m.ft)
    u *= len(m.alias_p)
    slot = u.astype(np.int16)
    u -= slot  # the fraction is a second uniform, independent of the slot
    cls = np.where(u < m.alias_p[slot], slot, m.alias_i[slot])
    return e, cls


def _queue(
    cfg: SimConfig, m: _Model, e: np.ndarray, det: np.ndarray, cls: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray | None, np.ndarray]:
    """(share of the job that runs in each cycle, None where it is full everywhere; trials that must
    wait for a repaired node); a trial that is not deferred never waits."""
    rows, cols = e.shape
    must = np.zeros(rows, dtype=bool)
    if m.sizer is None or m.replica:  # nobody waits, the job always runs at full size
        return None, must
    flat = np.flatnonzero(m.node_loss[cls])
    col = flat % cols
    ends = end.ravel()
    start = np.where(col > 0, ends[flat - 1], 0.0)  # when each node loss's cycle started
    flat = flat[e.ravel()[flat] < cfg.horizon_s - start]  # losses after the horizon never happen
    must, over, values = repair_queue(
        m.sizer, m.repair_s, cfg.spare_nodes or 0, ends[flat], flat // cols, rows
    )
    at = flat[over]
    if not len(at):
        return None, must
    share = np.ones((rows, cols), dtype=m.ft)
    nxt = at % cols < cols - 1  # a shrunk job runs the next cycle at the smaller size
    share.ravel()[at[nxt] + 1] = values[nxt]
    return share, must


def _run_split(sch: _Schedule, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(compute seconds, completed base checkpoints, completed stall seconds) in ``x`` wall seconds of
    a run phase; the rest of ``x`` is a stall still in progress."""
    q = np.floor(x / sch.period_wall)
    r = x - q * sch.period_wall
    full = q * float(sch.stall_cum[-1])
    if len(sch.stall_end) == 1:  # one tier: a stall ends every period; r < period_wall
        return q * sch.period_compute + np.minimum(r, sch.base), q, full
    j = np.searchsorted(sch.stall_end, r, side="right")
    cum = sch.stall_cum.astype(x.dtype)[j]
    compute_in = np.minimum(r - cum, (j + 1).astype(x.dtype) * sch.base)
    return q * sch.period_compute + compute_in, q * len(sch.stall_end) + j.astype(x.dtype), full + cum


def _recovery(m: _Model, cls: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(restart, restore, planned-stop stall, requeued) of the recovery that starts each cycle: from
    the previous cycle's failure; the first cycle is the start-up."""
    rows, cols = cls.shape
    r_restart = np.empty((rows, cols), dtype=m.ft)
    r_restore = np.empty((rows, cols), dtype=m.ft)
    r_stall = np.zeros((rows, cols), dtype=m.ft)
    r_restart[:, 0], r_restore[:, 0] = m.first
    r_restart[:, 1:] = m.restart[cls[:, :-1]]
    r_restore[:, 1:] = m.restore[cls[:, :-1]]
    if m.plan_stall[-1] > 0:
        r_stall[:, 1:] = m.plan_stall[cls[:, :-1]]
    stopped = np.zeros((rows, cols), dtype=bool)  # the restart policy stopped the job: requeue
    if m.period is not None:
        infra = cls != m.n_cls
        infra_n = np.cumsum(infra, axis=1)
        stopped[:, 1:] = infra[:, :-1] & (infra_n[:, :-1] % m.period == 0)
        r_restart[:, 1:] = np.where(stopped[:, 1:], m.requeue[0], r_restart[:, 1:])
        r_restore[:, 1:] = np.where(stopped[:, 1:], m.requeue[1], r_restore[:, 1:])
    return r_restart, r_restore, r_stall, stopped


def _backoff(m: _Model, e: np.ndarray, rec: np.ndarray, cls: np.ndarray, stopped: np.ndarray) -> np.ndarray:
    """The agent's back-off added to each cycle's restart: after failures in a row whose attempts made
    no progress (the failure came during the recovery), it waits before the next attempt. Waiting
    lengthens the next recovery, which can make its failure one without progress too, so the waits are
    a fixed point, found by passes that only lengthen streaks (one cycle per pass at most; a streak
    that the back-off alone makes longer than ``BACKOFF_PASSES`` cycles is cut there). A planned stop
    is no failure and a requeue starts a new job: both end a streak."""
    rows, cols = e.shape
    assert m.backoff is not None
    table = m.backoff.astype(rec.dtype)
    top = len(table) - 1
    ix = np.arange(cols)
    planned = cls == m.n_cls  # a planned stop is no failure: it never extends a streak
    wait = np.zeros_like(rec)
    for _ in range(BACKOFF_PASSES):
        stuck = (e < rec + wait) & ~planned  # failures of attempts that made no progress
        last = np.where(stuck, -1, ix)  # cycles that end a streak
        last[:, :-1] = np.where(stopped[:, 1:], ix[:-1], last[:, :-1])  # the next cycle is a new job
        streak = ix - np.maximum.accumulate(last, axis=1)  # failures in a row without progress
        new = np.zeros_like(rec)
        new[:, 1:] = np.where(stopped[:, 1:], 0.0, table[np.minimum(streak[:, :-1], top)])
        if np.array_equal(new, wait):
            break
        wait = new
    return wait


def _fail_at(cfg: SimConfig, sch: _Schedule, m: _Model, e: np.ndarray, cls: np.ndarray) -> np.ndarray:
    """Offset of each cycle's failure from the cycle's start: the draw itself, or (failures only while
    training) the draw after the recovery; with failures only between steps, one drawn inside a save
    comes when that save ends (chaos faults fire at steps, never inside a save)."""
    if (cfg.fail_in_recovery and cfg.fail_in_save) or m.replica:
        return e
    r_restart, r_restore, r_stall, _ = _recovery(m, cls)
    rec = r_restart + r_restore + r_stall
    at = e if cfg.fail_in_recovery else e + rec
    if not cfg.fail_in_save:
        x = np.maximum(at - rec, 0.0)  # into the run phase (0: the failure came during the recovery)
        compute, _, stalled = _run_split(sch, x)
        q = np.floor(x / sch.period_wall)
        r = x - q * sch.period_wall
        j = np.minimum(np.searchsorted(sch.stall_end, r, side="right"), len(sch.stall_end) - 1)
        inside = (x - compute - stalled) > 0
        at = np.where(inside, at + (sch.stall_end.astype(at.dtype)[j] - r), at)
    return at.astype(e.dtype, copy=False)


def _finish(
    cfg: SimConfig,
    sch: _Schedule,
    m: _Model,
    rng: np.random.Generator,
    e: np.ndarray,
    det: np.ndarray,
    cls: np.ndarray,
    wait: np.ndarray | None,
    share: np.ndarray | None,
    end: np.ndarray | None,
    want_trace: bool,
) -> tuple[dict[str, np.ndarray], np.ndarray, list[dict[str, float]]]:
    """Every bucket of every trial, given the draws and the repair queue's waits and shares."""
    horizon = cfg.horizon_s
    rows, cols = e.shape
    planned = cls == m.n_cls
    lost = m.node_loss[cls]
    r_restart, r_restore, r_stall, stopped = _recovery(m, cls)
    if m.backoff is not None and not m.replica:
        r_restart = r_restart + _backoff(m, e, r_restart + r_restore + r_stall, cls, stopped)
    if m.replica:
        # the job never stops for a recovery: one cycle = run until the failure, detection, rejoin
        end = np.cumsum(e + det + cfg.replica_rejoin_s, axis=1, dtype=np.float64)
    elif wait is not None:
        wait = wait.astype(m.ft, copy=False)
        end = np.cumsum(e + det + wait, axis=1, dtype=np.float64)
    assert end is not None
    start = np.empty_like(end)
    start[:, 0] = 0.0
    start[:, 1:] = end[:, :-1]
    avail = np.subtract(horizon, start, dtype=m.ft, casting="same_kind")
    np.maximum(avail, 0.0, out=avail)
    hit = e < avail
    rec = r_restart + r_restore
    if m.plan_stall[-1] > 0:
        rec += r_stall
    b: dict[str, np.ndarray] = {name: np.zeros(rows) for name in BUCKETS}
    away_rec = None
    if m.replica:  # only the start-up stops the whole job; later recoveries are one group's
        away_rec = np.zeros((rows, cols))
        away_rec[:, 1:] = rec[:, 1:]
        r_restart[:, 1:] = r_restore[:, 1:] = r_stall[:, 1:] = 0.0
        rec = r_restart + r_restore + r_stall
    until = np.minimum(e, avail)  # the cycle's time before its failure or the horizon
    spent_rec = np.minimum(until, rec)
    x = np.maximum(until - rec, 0.0)  # zero when the failure came during the recovery
    done = e >= rec
    fails_in_run = hit & done
    compute, n_ckpt, stalled = _run_split(sch, x)
    committed_n = n_ckpt
    if sch.persist > 0:  # a checkpoint counts once its background persist has finished
        committed_n = _run_split(sch, np.maximum(x - sch.persist, 0.0))[1]
    committed = committed_n * sch.base
    if sch.durable_every > 1:  # a node loss rolls back further, to the newest durable checkpoint
        durable = np.floor(committed_n / sch.durable_every) * sch.durable_every * sch.base
        committed = np.where(lost, durable, committed)
    if m.replica:
        kept = compute  # survivors never roll back; the failed group takes a live replica's state
    else:
        kept = np.where(fails_in_run & ~planned, committed, compute)
    # stragglers: episodes during a run phase slow the whole job until mitigated
    strag_rate = cfg.straggler_per_node_day * cfg.nodes / 86400.0
    slow_loss = cfg.straggler_slowdown / (1.0 + cfg.straggler_slowdown)
    slow = None
    if strag_rate > 0 and slow_loss > 0:
        episodes = rng.poisson(strag_rate * x)
        slow = np.where(x > 0, np.minimum(x, episodes * cfg.straggler_mitigate_s) / np.maximum(x, 1e-9), 0.0)
        slow *= slow_loss
    uniform = m.sizer is None or m.replica  # the job always runs at full size
    good = kept if uniform or share is None else kept * share.astype(m.ft, copy=False)
    if not uniform:
        b["shrunk"] = (kept - good).sum(axis=1, dtype=np.float64)
    if strag_rate > 0 and slow_loss > 0:
        b["straggler_slowdown"] = (good * slow).sum(axis=1, dtype=np.float64)
        good = good - good * slow
    if m.replica:
        # the previous failure's group is away for its recovery (and any wait): its share is lost
        assert away_rec is not None
        away = np.minimum(np.minimum(away_rec, x) / cfg.replica_groups, good)
        b["replica_away"] = away.sum(axis=1, dtype=np.float64)
        good = good - away
    b["productive"] = good.sum(axis=1, dtype=np.float64)
    # a save cut short by the failure never committed: its stall is lost work, as the report sees it
    cut = np.where(fails_in_run, x - compute - stalled, 0.0).sum(axis=1, dtype=np.float64)
    sum_compute = compute.sum(axis=1, dtype=np.float64)
    b["lost_work"] = sum_compute - kept.sum(axis=1, dtype=np.float64) + cut
    b["checkpoint_stall"] = x.sum(axis=1, dtype=np.float64) - sum_compute - cut
    # the recovery: restart first, then restore, then (after a planned stop) the checkpoint it took;
    # a restore cut short by a failure never finished, so it is restart time (as the report sees it)
    restart_part = np.where(done, np.minimum(spent_rec, r_restart), spent_rec)
    left = spent_rec - restart_part  # >= 0; zero where the recovery was cut short
    restore_part = np.minimum(r_restore, left)
    b["checkpoint_restore"] = restore_part.sum(axis=1, dtype=np.float64)
    if m.plan_stall[-1] > 0:
        stall_part = np.minimum(r_stall, left - restore_part)
        b["checkpoint_stall"] += stall_part.sum(axis=1, dtype=np.float64)
    else:
        stall_part = r_stall
    b["startup"] = restart_part[:, 0]
    if m.period is not None:
        b["queue"] = np.where(stopped, restart_part, 0.0).sum(axis=1, dtype=np.float64)
        b["restart"] = np.where(stopped[:, 1:], 0.0, restart_part[:, 1:]).sum(axis=1, dtype=np.float64)
    else:
        b["restart"] = restart_part[:, 1:].sum(axis=1, dtype=np.float64)
    d = np.minimum(det, np.maximum(avail - e, 0.0))  # zero where no failure came before the horizon
    b["detection"] = d.sum(axis=1, dtype=np.float64)
    rest = None  # what is left of the cycle after the detection (a rejoin or a wait ends within it)
    if m.replica or wait is not None:
        rest = np.where(hit, np.maximum(avail - e - d, 0.0), 0.0)
    if m.replica:
        assert rest is not None
        pause = np.where(hit, np.minimum(cfg.replica_rejoin_s, rest), 0.0)
        b["restart"] += pause.sum(axis=1, dtype=np.float64)
    elif wait is not None:
        assert rest is not None
        b["wait_nodes"] = np.where(hit, np.minimum(wait, rest), 0.0).sum(axis=1, dtype=np.float64)
    cnt = np.zeros((rows, m.n_cls + 1), dtype=np.int64)
    flat = (np.arange(rows, dtype=np.int32)[:, None] * (m.n_cls + 1) + cls)[hit]
    cnt += np.bincount(flat, minlength=rows * (m.n_cls + 1)).reshape(rows, m.n_cls + 1)
    tr: list[dict[str, float]] = []
    if want_trace:
        for i in range(cols):
            if start[0, i] >= horizon:
                break
            c = int(cls[0, i])
            tr.append(
                {
                    "start": float(start[0, i]),
                    "until_failure": float(e[0, i]),
                    "restart": float(restart_part[0, i]),
                    "restore": float(restore_part[0, i]),
                    "plan_stall": float(stall_part[0, i]),
                    "run": float(x[0, i]),
                    "compute": float(compute[0, i]),
                    "checkpoints": float(n_ckpt[0, i]),
                    "kept": float(kept[0, i]),
                    "failed": bool(hit[0, i]),
                    "class": cfg.failures[c].name if c < m.n_cls else "planned",
                    "node_loss": bool(lost[0, i]),
                    "detection": float(d[0, i]),
                    "wait": float(min(wait[0, i], rest[0, i]))
                    if wait is not None and rest is not None and not m.replica
                    else 0.0,
                    "requeued": bool(stopped[0, i]),
                    "recovered": bool(done[0, i] and rec[0, i] <= avail[0, i]),
                }
            )
    return b, cnt, tr
