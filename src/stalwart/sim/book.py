"""Booking a chunk's cycles into the report's buckets (``sim/buckets.py``): given the draws, the
repair queue's waits and shares, every bucket of every trial, the count of failures per class, and
(for trial 0, on request) the cycle-by-cycle trace."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

import numpy as np

from .buckets import SIM_BUCKETS
from .config import SimConfig
from .cycles import backoff, recovery, run_split, running_sum
from .model import Model, Schedule
from .phase import Split, carried

# one cycle of trial 0 (seconds unless said otherwise); "class" is a Python keyword, hence this form
TraceRow = TypedDict(
    "TraceRow",
    {
        "start": float,
        "until_failure": float,
        "restart": float,
        "restore": float,
        "plan_stall": float,  # the checkpoint a planned stop took, in this cycle's recovery
        "run": float,
        "compute": float,
        "checkpoints": float,  # base checkpoints completed in the run phase
        "kept": float,
        "failed": bool,
        "class": str,  # the failure class's name, or "planned"
        "node_loss": bool,
        "detection": float,
        "wait": float,  # for a repaired node
        "requeued": bool,
        "recovered": bool,
    },
)
Booked = tuple[dict[str, np.ndarray], np.ndarray, list[TraceRow]]  # buckets, counts, trace


@dataclass(frozen=True)
class Draws:
    """A chunk's cycles as the engine hands them over: failure offsets, detection, classes, and the
    repair queue's answers (``wait``: per-cycle waits of trials walked one by one; ``share``: the
    fraction of the job that runs; ``end``: cycle ends when nobody waits)."""

    e: np.ndarray
    det: np.ndarray
    cls: np.ndarray
    wait: np.ndarray | None
    share: np.ndarray | None
    end: np.ndarray | None


@dataclass
class _Recovery:
    """The recovery that starts each cycle, split into its parts (seconds each)."""

    restart: np.ndarray
    restore: np.ndarray
    stall: np.ndarray
    stopped: np.ndarray  # the restart policy stopped the job before this cycle: requeue
    total: np.ndarray
    away: np.ndarray | None  # replica: one group's recovery, the job runs on without it


def book(
    cfg: SimConfig,
    sch: Schedule,
    m: Model,
    rng: np.random.Generator,
    d: Draws,
    want_trace: bool,
    *,
    trim: bool = True,
) -> Booked:
    """Every bucket of every trial, given the draws and the repair queue's waits and shares.

    ``trim``: book only the cycles up to the last that starts before the horizon in some trial; the
    cycles after it book nothing (every bucket's share of them is zero, and a straggler draw with a
    zero mean takes nothing from the stream), so only the order of the sums' terms changes."""
    horizon = cfg.horizon_s
    end, wait = _ends(cfg, m, d)
    if trim and end.shape[0]:
        keep = int(np.count_nonzero(end < horizon, axis=1).max()) + 1  # cycles that start before it
        if keep < end.shape[1]:
            cut = slice(0, keep)
            share = None if d.share is None else d.share[:, cut]
            d = Draws(d.e[:, cut], d.det[:, cut], d.cls[:, cut], None, share, None)
            end, wait = end[:, cut], None if wait is None else wait[:, cut]
    e, det, cls = d.e, d.det, d.cls
    rows, cols = e.shape
    planned = cls == m.n_cls
    lost = m.node_loss[cls]
    r = _recovery(m, e, cls)
    start = np.empty_like(end)
    start[:, 0] = 0.0
    start[:, 1:] = end[:, :-1]
    avail = np.subtract(horizon, start, dtype=m.ft, casting="same_kind")
    np.maximum(avail, 0.0, out=avail)
    hit = e < avail
    _fold(m, r)
    b: dict[str, np.ndarray] = {name: np.zeros(rows) for name in SIM_BUCKETS}
    until = np.minimum(e, avail)  # the cycle's time before its failure or the horizon
    spent_rec = np.minimum(until, r.total)
    x = np.maximum(until - r.total, 0.0)  # zero when the failure came during the recovery
    done = e >= r.total
    fails_in_run = hit & done
    # a planned stop takes a checkpoint and a class recovered in place keeps its state: neither rolls back
    rolling = np.zeros_like(hit) if m.replica else ~planned if m.rolls_back is None else m.rolls_back[cls]
    compute, n_ckpt, stalled = run_split(sch, x)  # every run phase from a checkpoint, at phase 0
    kept = _kept(sch, m, x, n_ckpt, compute, lost, fails_in_run & rolling)
    if (keeps := hit & ~rolling & ~planned).any():
        # a recovery that keeps the progress: the run phases after it start mid-interval (sim/phase.py)
        split = carried(sch, x, keeps, hit & rolling, lost, Split(compute, n_ckpt, stalled, kept))
        compute, n_ckpt, stalled, kept = split.compute, split.n_ckpt, split.stalled, split.kept
    _productive(cfg, m, rng, b, x, kept, d.share, r.away)
    # a save cut short by the failure never committed: its stall is lost work, as the report sees it
    cut = np.where(fails_in_run, x - compute - stalled, 0.0).sum(axis=1, dtype=np.float64)
    sum_compute = compute.sum(axis=1, dtype=np.float64)
    b["lost_work"] = sum_compute - kept.sum(axis=1, dtype=np.float64) + cut
    b["checkpoint_stall"] = x.sum(axis=1, dtype=np.float64) - sum_compute - cut
    restart_part, restore_part, stall_part = _recovery_buckets(m, b, r, done, spent_rec)
    det_part = np.minimum(det, np.maximum(avail - e, 0.0))  # zero where no failure came before the horizon
    b["detection"] = det_part.sum(axis=1, dtype=np.float64)
    rest = _after_detection(cfg, m, b, wait, hit, avail, e, det_part)
    cnt = np.zeros((rows, m.n_cls + 1), dtype=np.int64)
    flat = (np.arange(rows, dtype=np.int32)[:, None] * (m.n_cls + 1) + cls)[hit]
    cnt += np.bincount(flat, minlength=rows * (m.n_cls + 1)).reshape(rows, m.n_cls + 1)
    if not want_trace:
        return b, cnt, []
    waited = np.zeros((1, cols)) if wait is None or rest is None or m.replica else np.minimum(wait, rest)
    cycles = _Trial0(
        start[0],
        e[0],
        restart_part[0],
        restore_part[0],
        stall_part[0],
        x[0],
        compute[0],
        n_ckpt[0],
        kept[0],
        hit[0],
        cls[0],
        lost[0],
        det_part[0],
        waited[0],
        r.stopped[0],
        (done & (r.total <= avail))[0],
    )
    return b, cnt, _trace(cfg, m, horizon, cycles)


def _recovery(m: Model, e: np.ndarray, cls: np.ndarray) -> _Recovery:
    """Each cycle's recovery, with the agent's back-off added to its restart."""
    r_restart, r_restore, r_stall, stopped = recovery(m, cls)
    if m.backoff is not None and not m.replica:
        r_restart = r_restart + backoff(m, e, r_restart + r_restore + r_stall, cls, stopped)
    return _Recovery(r_restart, r_restore, r_stall, stopped, r_restart + r_restore, None)


def _fold(m: Model, r: _Recovery) -> None:
    """The recovery's total (a planned stop's checkpoint included); with replicas only the start-up
    stops the whole job, later recoveries are one group's (``away``)."""
    if m.plan_stall[-1] > 0:
        r.total += r.stall
    if m.replica:
        r.away = np.zeros(r.total.shape)
        r.away[:, 1:] = r.total[:, 1:]
        r.restart[:, 1:] = r.restore[:, 1:] = r.stall[:, 1:] = 0.0
        r.total = r.restart + r.restore + r.stall


def _ends(cfg: SimConfig, m: Model, d: Draws) -> tuple[np.ndarray, np.ndarray | None]:
    """When each cycle ends (float64), and the waits for a repaired node in the cycles' dtype."""
    wait, end = d.wait, d.end
    if m.replica:
        # the job never stops for a recovery: one cycle = run until the failure, detection, rejoin
        end = running_sum(d.e + d.det + cfg.replica_rejoin_s)
    elif wait is not None:
        wait = wait.astype(m.ft, copy=False)
        end = running_sum(d.e + d.det + wait)
    assert end is not None
    return end, wait


def _kept(
    sch: Schedule,
    m: Model,
    x: np.ndarray,
    n_ckpt: np.ndarray,
    compute: np.ndarray,
    lost: np.ndarray,
    rolls_back: np.ndarray,
) -> np.ndarray:
    """The compute each cycle keeps: all of it, or (a failure during the run) what its newest
    committed checkpoint holds."""
    if not rolls_back.any():
        return compute
    committed_n = n_ckpt
    if sch.persist > 0:  # a checkpoint counts once its background persist has finished
        committed_n = run_split(sch, np.maximum(x - sch.persist, 0.0))[1]
    committed = committed_n * sch.base
    if sch.durable_every > 1:  # a node loss rolls back further, to the newest durable checkpoint
        durable = np.floor(committed_n / sch.durable_every) * sch.durable_every * sch.base
        committed = np.where(lost, durable, committed)
    return np.where(rolls_back, committed, compute)


def _productive(
    cfg: SimConfig,
    m: Model,
    rng: np.random.Generator,
    b: dict[str, np.ndarray],
    x: np.ndarray,
    kept: np.ndarray,
    share: np.ndarray | None,
    away_rec: np.ndarray | None,
) -> None:
    """Kept compute into productive time, less a shrunk job's missing share, stragglers' slowdown and
    (replicas) the share of the group that is away."""
    # stragglers: episodes during a run phase slow the whole job until mitigated
    strag_rate = cfg.straggler_per_node_day * cfg.nodes / 86400.0
    slow_loss = cfg.straggler_slowdown / (1.0 + cfg.straggler_slowdown)
    uniform = m.sizer is None or m.replica  # the job always runs at full size
    good = kept if uniform or share is None else kept * share.astype(m.ft, copy=False)
    if not uniform:
        b["shrunk"] = (kept - good).sum(axis=1, dtype=np.float64)
    if strag_rate > 0 and slow_loss > 0:
        episodes = rng.poisson(strag_rate * x)
        slow = np.where(x > 0, np.minimum(x, episodes * cfg.straggler_mitigate_s) / np.maximum(x, 1e-9), 0.0)
        slow *= slow_loss
        b["straggler_slowdown"] = (good * slow).sum(axis=1, dtype=np.float64)
        good = good - good * slow
    if cfg.slow_steps > 0:  # steady slow steps (a measured run's): the same share of every run phase
        slow_all = good * (cfg.slow_steps / (1.0 + cfg.slow_steps))
        b["straggler_slowdown"] = b.get("straggler_slowdown", 0.0) + slow_all.sum(axis=1, dtype=np.float64)
        good = good - slow_all
    if m.replica:
        # the previous failure's group is away for its recovery (and any wait): its share is lost
        assert away_rec is not None
        away = np.minimum(np.minimum(away_rec, x) / cfg.replica_groups, good)
        b["replica_away"] = away.sum(axis=1, dtype=np.float64)
        good = good - away
    b["productive"] = good.sum(axis=1, dtype=np.float64)


def _recovery_buckets(
    m: Model, b: dict[str, np.ndarray], r: _Recovery, done: np.ndarray, spent_rec: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The recovery: restart first, then restore, then (after a planned stop) the checkpoint it took;
    a restore cut short by a failure never finished, so it is restart time (as the report sees it).
    Returns the parts spent in each cycle."""
    restart_part = np.where(done, np.minimum(spent_rec, r.restart), spent_rec)
    left = spent_rec - restart_part  # >= 0; zero where the recovery was cut short
    restore_part = np.minimum(r.restore, left)
    b["checkpoint_restore"] = restore_part.sum(axis=1, dtype=np.float64)
    if m.plan_stall[-1] > 0:
        stall_part = np.minimum(r.stall, left - restore_part)
        b["checkpoint_stall"] += stall_part.sum(axis=1, dtype=np.float64)
    else:
        stall_part = r.stall
    b["startup"] = restart_part[:, 0]
    if m.period is not None:
        b["queue"] = np.where(r.stopped, restart_part, 0.0).sum(axis=1, dtype=np.float64)
        b["restart"] = np.where(r.stopped[:, 1:], 0.0, restart_part[:, 1:]).sum(axis=1, dtype=np.float64)
    else:
        b["restart"] = restart_part[:, 1:].sum(axis=1, dtype=np.float64)
    return restart_part, restore_part, stall_part


def _after_detection(
    cfg: SimConfig,
    m: Model,
    b: dict[str, np.ndarray],
    wait: np.ndarray | None,
    hit: np.ndarray,
    avail: np.ndarray,
    e: np.ndarray,
    det_part: np.ndarray,
) -> np.ndarray | None:
    """What is left of each cycle after the detection, booked as a replica's rejoin or a wait for a
    repaired node, which end within it; None when neither applies."""
    if not m.replica and wait is None:
        return None
    rest = np.where(hit, np.maximum(avail - e - det_part, 0.0), 0.0)
    if m.replica:
        pause = np.where(hit, np.minimum(cfg.replica_rejoin_s, rest), 0.0)
        b["restart"] += pause.sum(axis=1, dtype=np.float64)
    else:
        assert wait is not None
        b["wait_nodes"] = np.where(hit, np.minimum(wait, rest), 0.0).sum(axis=1, dtype=np.float64)
    return rest


@dataclass(frozen=True)
class _Trial0:
    """Trial 0's per-cycle values, for the trace."""

    start: np.ndarray
    until_failure: np.ndarray
    restart: np.ndarray
    restore: np.ndarray
    plan_stall: np.ndarray
    run: np.ndarray
    compute: np.ndarray
    checkpoints: np.ndarray
    kept: np.ndarray
    failed: np.ndarray
    cls: np.ndarray
    node_loss: np.ndarray
    detection: np.ndarray
    wait: np.ndarray
    requeued: np.ndarray
    recovered: np.ndarray


def _trace(cfg: SimConfig, m: Model, horizon: float, t: _Trial0) -> list[TraceRow]:
    """Trial 0 cycle by cycle, up to the horizon."""
    tr: list[TraceRow] = []
    for i in range(len(t.start)):
        if t.start[i] >= horizon:
            break
        c = int(t.cls[i])
        tr.append(
            {
                "start": float(t.start[i]),
                "until_failure": float(t.until_failure[i]),
                "restart": float(t.restart[i]),
                "restore": float(t.restore[i]),
                "plan_stall": float(t.plan_stall[i]),
                "run": float(t.run[i]),
                "compute": float(t.compute[i]),
                "checkpoints": float(t.checkpoints[i]),
                "kept": float(t.kept[i]),
                "failed": bool(t.failed[i]),
                "class": cfg.failures[c].name if c < m.n_cls else "planned",
                "node_loss": bool(t.node_loss[i]),
                "detection": float(t.detection[i]),
                "wait": float(t.wait[i]),
                "requeued": bool(t.requeued[i]),
                "recovered": bool(t.recovered[i]),
            }
        )
    return tr
