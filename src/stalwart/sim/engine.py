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
to the newest completed checkpoint of a tier that survives it, unless its class is recovered in place
(``FailureClass.in_place``: the survivors keep the live state); a class may have its own restart time.

Policies are the agent's own (``sim/policies.py``): the restart budget, the hang timeout and the
world-size / spare choice. Time is booked into the report's bucket names (``sim/buckets.py``).

Where each part lives: ``model.py`` (the checkpoint schedule and the per-class model), this module
(the policies asked, the chunks of trials run on threads, the second pass), ``cycles.py`` (the
per-cycle arrays: draws, failure times, recoveries, back-off, the repair queue's shares) and
``book.py`` (the buckets, the counts and the trace of trial 0).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import NamedTuple, TypeVar

import numpy as np
from typing_extensions import assert_never

from ..errors import ConfigError
from ..policy.restart_policy import RestartBudget
from ..policy.timeouts import HangTimeoutPolicy
from ..policy.world_size import SizeRule
from .book import Booked, Draws, TraceRow, book
from .buckets import SIM_BUCKETS
from .config import FailureClass, SimConfig
from .cycles import draw, fail_at, running_sum, shares
from .model import Model, Schedule, alias
from .model import schedule as _schedule
from .policies import WorldSizer, hang_detect_s, restart_backoff, restart_period
from .repair import effective
from .repair_queue import Piece, fixed_waits_of, sequential_waits
from .sdc import SDC_CLASS, found_after_s

BUCKETS = SIM_BUCKETS
CHUNK_CELLS = 1 << 17  # trials x cycles per chunk: arrays of 0.5-1 MiB that stay in the CPU cache
MAX_WORKERS = 8  # threads over the chunks (numpy's loops run without the GIL)
# above this many trials x cycles, per-cycle quantities are float32 (a few ms per cycle; times and sums
# stay float64): half the memory traffic. Smaller runs and traced ones are float64 throughout.
FLOAT32_CELLS = 1 << 22
MAX_EXPECTED_INTERRUPTIONS = 100_000  # per trial; a year at 100k GPUs of the Llama-3 mix is ~20k

__all__ = ["BUCKETS", "MAX_EXPECTED_INTERRUPTIONS", "SimResult", "simulate"]


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
    trace: list[TraceRow] = field(default_factory=list)  # trial 0, cycle by cycle (trace=True)

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


def _model(cfg: SimConfig, sch: Schedule) -> Model:
    """The per-class model of ``cfg``, with the agent's policies asked for their answers."""
    classes = cfg.failures
    lam = cfg.failure_rate_per_s() + cfg.planned_rate_per_s()
    weights = np.array([f.per_1000_gpu_days for f in classes] + [cfg.planned_per_1000_gpu_days], float)
    cdf = np.cumsum(weights / weights.sum()) if lam > 0 else np.array([1.0])
    n_cls = len(classes)
    node_loss = np.array([f.node_loss for f in classes] + [False])
    hang_s = None
    if cfg.step_s is not None:
        policy = HangTimeoutPolicy(
            multiplier=cfg.hang.multiplier,
            floor_s=cfg.hang.floor_s,
            cap_s=max(cfg.hang.cap_s, cfg.hang.floor_s),
        )
        hang_s = hang_detect_s(cfg.step_s, policy)
    checked = found_after_s(
        cfg.sdc.every, cfg.sdc.budget, cfg.step_s, cfg.sdc_check_s, min(t.interval_s for t in cfg.tiers)
    )

    def detect_s(f: FailureClass) -> float:
        if f.kind == "hang" and hang_s is not None:
            return hang_s
        if f.name == SDC_CLASS and checked is not None:  # found by the replicas' next check
            return checked
        return f.detect_s

    detect = np.array([detect_s(f) + cfg.decide_s for f in classes] + [0.0])
    restart, restore = _recovery_costs(cfg, sch, node_loss, n_cls)
    plan_stall = np.zeros(n_cls + 1)
    plan_stall[n_cls] = sum(t.stall_s for t in cfg.tiers)
    rolls_back = np.array([not (f.in_place or cfg.no_rollback) for f in classes] + [False])
    sizer = _sizer(cfg)
    budget = None if cfg.max_restarts is None else RestartBudget(max_restarts=cfg.max_restarts)
    alias_p, alias_i = alias(weights if lam > 0 else np.array([0.0] * n_cls + [1.0]))
    return Model(
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
        rolls_back=None if rolls_back[:n_cls].all() else rolls_back,
    )


def _recovery_costs(
    cfg: SimConfig, sch: Schedule, node_loss: np.ndarray, n_cls: int
) -> tuple[np.ndarray, np.ndarray]:
    """(restart, restore) seconds after a failure of each class (+ planned), by strategy; a class's own
    restart (``restart_s``) replaces the strategy's."""
    match cfg.strategy:
        case "in_process":
            # restarting in place skips work a job restart does, so it is never slower than one (a
            # measured job restart of 0.5 s must not be beaten by the 60 s default in-place guess)
            soft, hard = min(cfg.in_process_restart_s, cfg.job_restart_s), cfg.job_restart_s
        case "requeue":
            soft = hard = cfg.requeue_s
        case "in_job" | "replica":  # replica: the failed group restarts like a job, from a peer's memory
            soft = hard = cfg.job_restart_s
        case _:
            assert_never(cfg.strategy)
    restart = np.where(node_loss, hard + cfg.repair.spare_join_s, soft)  # a spare joins after a node loss
    own = [f.restart_s for f in cfg.failures]
    if any(s is not None for s in own):
        given = np.array([s is not None for s in own] + [False])
        restart = np.where(given, np.array([s or 0.0 for s in own] + [0.0]), restart)
    if cfg.strategy == "replica":
        restore = np.full(n_cls + 1, sch.restore_all)
    else:
        restore = np.where(node_loss, sch.restore_durable, sch.restore_all)
    return restart, restore


def _sizer(cfg: SimConfig) -> WorldSizer | None:
    """The agent's world-size / spare choice, when spares are finite."""
    if cfg.spare_nodes is None:
        return None
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
    return sizer


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


_T = TypeVar("_T")
_R = TypeVar("_R")


def _in_parallel(fn: Callable[[_T], _R], items: Sequence[_T], workers: int) -> list[_R]:
    """``[fn(x) for x in items]``, spread over ``workers`` threads (results in order)."""
    if workers <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items))) as ex:
        return list(ex.map(fn, items))


def simulate(cfg: SimConfig, *, trace: bool = False, workers: int | None = None) -> SimResult:
    """Every trial of ``cfg``; ``workers`` threads share the chunks (default: the CPUs this process
    may use, at most ``MAX_WORKERS``). Each chunk draws from its own stream of the seed, so the result
    does not depend on the number of threads."""
    cfg = effective(cfg)  # the repair pipeline, as failure rates
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
    if not trace and cfg.trials * k > FLOAT32_CELLS:
        f = np.float32
        m = replace(
            m,
            detect=m.detect.astype(f),
            restart=m.restart.astype(f),
            restore=m.restore.astype(f),
            plan_stall=m.plan_stall.astype(f),
            ft=f,
        )
    run = _Run(cfg, sch, m, k, trace, _workers() if workers is None else max(1, workers))
    deferred = run.first_pass()
    run.second_pass(deferred)
    counts = run.counts
    return SimResult(
        config=cfg,
        ettr=run.out_b["productive"] / horizon,
        interruptions=counts[:, : m.n_cls].sum(axis=1),
        planned=counts[:, m.n_cls],
        by_class={f.name: counts[:, i] for i, f in enumerate(cfg.failures)},
        buckets=run.out_b,
        iterations=2 if deferred else 1,
        extra={"job_failure_rate_per_h": cfg.failure_rate_per_s() * 3600.0},
        trace=run.tr,
    )


class _Waited(NamedTuple):
    """A chunk's trials that waited for a repaired node: every later cycle of theirs moves."""

    rows: np.ndarray
    e: np.ndarray
    cls: np.ndarray
    det: np.ndarray
    end: np.ndarray  # when each cycle ends without waits (float64): the walk starts from it


class _Job(NamedTuple):
    """Deferred trials walked cycle by cycle, ready to book."""

    rows: np.ndarray
    e: np.ndarray
    det: np.ndarray
    cls: np.ndarray
    wait: np.ndarray
    share: np.ndarray | None  # None: the job runs whole whenever it runs


class _Run:
    """One simulation's chunks of trials and where their results go. The first pass draws and books
    every chunk; trials that waited for a repaired node are set aside (by the width of their draws)
    and walked cycle by cycle in a second pass."""

    def __init__(self, cfg: SimConfig, sch: Schedule, m: Model, k: int, trace: bool, threads: int) -> None:
        n = cfg.trials
        self.cfg, self.sch, self.m, self.k, self.trace, self.threads = cfg, sch, m, k, trace, threads
        self.out_b = {b: np.zeros(n) for b in BUCKETS}
        self.counts = np.zeros((n, m.n_cls + 1), dtype=np.int64)
        self.rows_per_chunk = max(1, CHUNK_CELLS // k)
        self.tr: list[TraceRow] = []
        self.chunks = [(lo, min(n, lo + self.rows_per_chunk)) for lo in range(0, n, self.rows_per_chunk)]
        self.streams = np.random.SeedSequence(cfg.seed).spawn(len(self.chunks) + 1)  # the last: deferred

    def store(self, rows: np.ndarray, res: Booked) -> None:
        b, c, t0 = res
        for name in BUCKETS:
            self.out_b[name][rows] = b[name]  # chunks hold disjoint rows: threads never write the same cell
        self.counts[rows] = c
        if t0:
            self.tr = t0

    def book(self, rows: np.ndarray, rng: np.random.Generator, draws: Draws) -> None:
        self.store(rows, book(self.cfg, self.sch, self.m, rng, draws, self.trace and rows[0] == 0))

    def first_pass(self) -> dict[int, list[_Waited]]:
        """Every chunk; returns the trials that waited for a repaired node, by the width of their draws."""
        deferred: dict[int, list[_Waited]] = {}
        for part in _in_parallel(self.chunk, range(len(self.chunks)), self.threads):
            if part is not None:
                deferred.setdefault(part[0], []).append(part[1])
        return deferred

    def chunk(self, i: int) -> tuple[int, _Waited] | None:
        """Simulate chunk ``i``; returns the trials that waited for a repaired node, for a second pass."""
        cfg, m = self.cfg, self.m
        lo, hi = self.chunks[i]
        rng = np.random.default_rng(self.streams[i])
        kk = self.k
        while True:
            e, cls = draw(m, rng, hi - lo, kk)
            e = fail_at(
                cfg, self.sch, m, e, cls
            )  # from here on: offset of the failure from the cycle's start
            det = m.detect[cls]
            end = running_sum(e + det)  # when each cycle ends, without waits
            if (end[:, -1] >= cfg.horizon_s).all():
                break
            kk *= 2  # some trial did not reach the horizon in kk cycles: draw more (rare)
        rows = np.arange(lo, hi)
        share, must = shares(cfg, m, e, det, cls, end)
        waited = None
        if must.all():  # every trial waited for a repaired node: all of them for the second pass
            return kk, _Waited(rows, e, cls, det, end)
        if must.any():  # these trials waited for a repaired node: every later cycle moves
            waited = (kk, _Waited(rows[must], e[must], cls[must], det[must], end[must]))
            keep = ~must
            rows, e, det, cls, end = rows[keep], e[keep], det[keep], cls[keep], end[keep]
            share = share[keep] if share is not None else None
        if len(rows):
            self.book(rows, rng, Draws(e, det, cls, None, share, end))
        return waited

    def second_pass(self, deferred: dict[int, list[_Waited]]) -> None:
        """The trials that waited, walked cycle by cycle, then booked in chunks."""
        jobs: list[_Job] = []
        for parts in deferred.values():
            jobs.extend(self.walk(parts))
        fin_streams = self.streams[-1].spawn(len(jobs)) if jobs else []

        def finish(j: int) -> None:
            job = jobs[j]
            rng = np.random.default_rng(fin_streams[j])
            self.book(job.rows, rng, Draws(job.e, job.det, job.cls, job.wait, job.share, None))

        _in_parallel(finish, range(len(jobs)), self.threads)

    def walk(self, parts: list[_Waited]) -> list[_Job]:
        """The waits and shares of deferred trials of one width, cycle by cycle. The walk costs per
        cycle, not per trial: the trials are split between the threads (slices, not index arrays: no
        copy of the trials' cycles)."""
        cfg, m = self.cfg, self.m
        sizer = m.sizer
        assert sizer is not None  # only a finite pool of spares makes a trial wait
        spares = cfg.spare_nodes or 0
        if not sizer.share(spares + 1)[0]:  # it never shrinks: the waits alone, loss by loss, no copies

            def waits(group: list[_Waited]) -> list[np.ndarray]:
                pieces = [Piece(p.e, p.det, m.node_loss[p.cls], p.end) for p in group]
                return fixed_waits_of(m.repair_s, spares, cfg.horizon_s, pieces)

            bounds = np.linspace(0, len(parts), min(self.threads, len(parts)) + 1).astype(int)
            groups = [parts[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
            return _jobs(
                parts,
                [w for ws in _in_parallel(waits, groups, self.threads) for w in ws],
                self.rows_per_chunk,
            )
        rows = np.concatenate([p.rows for p in parts])
        e = np.concatenate([p.e for p in parts])
        cls = np.concatenate([p.cls for p in parts])
        det = np.concatenate([p.det for p in parts])
        end = np.concatenate([p.end for p in parts])
        bounds = np.linspace(0, len(rows), min(self.threads, len(rows)) + 1).astype(int)
        cuts = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

        def walk(ix: slice) -> tuple[np.ndarray, np.ndarray | None]:
            return sequential_waits(
                sizer,
                m.repair_s,
                cfg.spare_nodes or 0,
                cfg.horizon_s,
                e[ix],
                det[ix],
                m.node_loss[cls[ix]],
                end[ix],
            )

        walked = _in_parallel(walk, cuts, self.threads)
        wait = np.concatenate([w for w, _ in walked])
        given = [s for _, s in walked if s is not None]  # the same path for every slice: all or none
        share = np.concatenate(given) if len(given) == len(walked) else None
        step = self.rows_per_chunk
        return [
            _Job(rows[sl], e[sl], det[sl], cls[sl], wait[sl], None if share is None else share[sl])
            for sl in (slice(lo, lo + step) for lo in range(0, len(rows), step))
        ]


def _jobs(parts: list[_Waited], waits: list[np.ndarray], step: int) -> list[_Job]:
    """The parts' trials, with their waits, in jobs of ``step`` trials (the last may have fewer): the
    jobs the concatenated trials would be cut into, copied only where a job spans parts."""
    jobs: list[_Job] = []
    bits: list[tuple[_Waited, np.ndarray, slice]] = []
    have = 0
    for p, w in zip(parts, waits, strict=True):
        lo = 0
        while lo < len(p.rows):
            take = min(step - have, len(p.rows) - lo)
            bits.append((p, w, slice(lo, lo + take)))
            have, lo = have + take, lo + take
            if have == step:
                jobs.append(_job(bits))
                bits, have = [], 0
    if bits:
        jobs.append(_job(bits))
    return jobs


def _job(bits: list[tuple[_Waited, np.ndarray, slice]]) -> _Job:
    if len(bits) == 1:
        p, w, sl = bits[0]
        return _Job(p.rows[sl], p.e[sl], p.det[sl], p.cls[sl], w[sl], None)

    def cat(pick: Callable[[_Waited, np.ndarray], np.ndarray]) -> np.ndarray:
        return np.concatenate([pick(p, w)[sl] for p, w, sl in bits])

    return _Job(
        cat(lambda p, w: p.rows),
        cat(lambda p, w: p.e),
        cat(lambda p, w: p.det),
        cat(lambda p, w: p.cls),
        cat(lambda p, w: w),
        None,
    )
