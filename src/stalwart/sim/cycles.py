"""The per-cycle arrays of a chunk of trials, (trials x cycles) at once: the failure draws, when each
failure comes, the recovery that starts each cycle, the agent's back-off, the run phase's checkpoint
schedule and the repair queue's shares (see ``engine`` for the model)."""

from __future__ import annotations

import numpy as np

from .config import SimConfig
from .model import Model, Schedule
from .repair_queue import repair_queue

BACKOFF_PASSES = 64  # the longest streak of failures without progress that back-off alone makes


def running_sum(steps: np.ndarray) -> np.ndarray:
    """Cumulative sums along each trial's cycles, in float64: ``np.cumsum(steps, axis=1,
    dtype=np.float64)``, cast first (an accumulate that casts as it goes is ~3x slower)."""
    out = steps.astype(np.float64)
    np.cumsum(out, axis=1, out=out)
    return out


def draw(m: Model, rng: np.random.Generator, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
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


def shares(
    cfg: SimConfig, m: Model, e: np.ndarray, det: np.ndarray, cls: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray | None, np.ndarray]:
    """(share of the job that runs in each cycle, None where it is full everywhere; trials that must
    wait for a repaired node); a trial that is not deferred never waits."""
    rows, cols = e.shape
    must = np.zeros(rows, dtype=bool)
    if m.sizer is None or m.replica:  # nobody waits, the job always runs at full size
        return None, must
    spares = cfg.spare_nodes or 0
    if not m.sizer.share(spares + 1)[0]:  # the job never shrinks: it waits, or runs whole
        return None, waits_for_repair(cfg.horizon_s, m.repair_s, spares, e, m.node_loss[cls], end)
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
    share: np.ndarray = np.ones((rows, cols), dtype=m.ft)
    nxt = at % cols < cols - 1  # a shrunk job runs the next cycle at the smaller size
    share.ravel()[at[nxt] + 1] = values[nxt]
    return share, must


def waits_for_repair(
    horizon: float, repair_s: float, spares: int, e: np.ndarray, lost: np.ndarray, end: np.ndarray
) -> np.ndarray:
    """Trials whose job (one that never shrinks) ever waits for a repaired node, assuming nobody waits:
    some node loss before the horizon comes while the loss ``spares`` places earlier is in repair.
    Failure times only grow along a trial, so the losses before the horizon are a prefix of them and
    the first such loss decides. Trial by trial: no index array over every loss of the chunk."""
    rows = e.shape[0]
    must = np.zeros(rows, dtype=bool)
    for r in range(rows):
        at = np.flatnonzero(lost[r])  # the cycles of its node losses
        if len(at) <= spares:
            continue
        t = end[r].take(at)  # when each loss was detected, without waits
        over = t[: len(t) - spares] > t[spares:] - repair_s  # [k - spares] still in repair at loss k
        k = int(np.argmax(over))
        if not over[k]:
            continue
        c = int(at[k + spares])
        start = float(end[r, c - 1]) if c else 0.0
        must[r] = float(e[r, c]) < horizon - start  # a failure after the horizon never happens
    return must


def run_split(sch: Schedule, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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


def recovery(m: Model, cls: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(restart, restore, planned-stop stall, requeued) of the recovery that starts each cycle: from
    the previous cycle's failure; the first cycle is the start-up."""
    rows, cols = cls.shape
    r_restart: np.ndarray = np.empty((rows, cols), dtype=m.ft)
    r_restore: np.ndarray = np.empty((rows, cols), dtype=m.ft)
    r_stall: np.ndarray = np.zeros((rows, cols), dtype=m.ft)
    r_restart[:, 0], r_restore[:, 0] = m.first
    r_restart[:, 1:] = m.restart[cls[:, :-1]]
    r_restore[:, 1:] = m.restore[cls[:, :-1]]
    if m.plan_stall[-1] > 0:
        r_stall[:, 1:] = m.plan_stall[cls[:, :-1]]
    stopped = np.zeros((rows, cols), dtype=bool)  # the restart policy stopped the job: requeue
    if m.period is not None:
        infra = cls != m.n_cls
        infra_n = np.cumsum(infra.astype(np.int64), axis=1)  # cast first: an accumulate that casts is slow
        stopped[:, 1:] = infra[:, :-1] & (infra_n[:, :-1] % m.period == 0)
        r_restart[:, 1:] = np.where(stopped[:, 1:], m.requeue[0], r_restart[:, 1:])
        r_restore[:, 1:] = np.where(stopped[:, 1:], m.requeue[1], r_restore[:, 1:])
    return r_restart, r_restore, r_stall, stopped


def backoff(m: Model, e: np.ndarray, rec: np.ndarray, cls: np.ndarray, stopped: np.ndarray) -> np.ndarray:
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


def fail_at(cfg: SimConfig, sch: Schedule, m: Model, e: np.ndarray, cls: np.ndarray) -> np.ndarray:
    """Offset of each cycle's failure from the cycle's start: the draw itself, or (failures only while
    training) the draw after the recovery; with failures only between steps, one drawn inside a save
    comes when that save ends (chaos faults fire at steps, never inside a save)."""
    if (cfg.fail_in_recovery and cfg.fail_in_save) or m.replica:
        return e
    r_restart, r_restore, r_stall, _ = recovery(m, cls)
    rec = r_restart + r_restore + r_stall
    at = e if cfg.fail_in_recovery else e + rec
    if not cfg.fail_in_save:
        x = np.maximum(at - rec, 0.0)  # into the run phase (0: the failure came during the recovery)
        q = np.floor(x / sch.period_wall)
        r = x - q * sch.period_wall
        j = np.minimum(np.searchsorted(sch.stall_end, r, side="right"), len(sch.stall_end) - 1)
        # inside the stall that ends segment j: past its compute. Compared directly, not as a remainder
        # (x - compute - stalled > 0): that difference is 0 only up to rounding, and its sign then
        # moved about half the failures drawn in compute to the next save's end
        inside = (r - sch.stall_cum.astype(at.dtype)[j]) > (j + 1).astype(at.dtype) * sch.base
        at = np.where(inside, at + (sch.stall_end.astype(at.dtype)[j] - r), at)
    return at.astype(e.dtype, copy=False)
