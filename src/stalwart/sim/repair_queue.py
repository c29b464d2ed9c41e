"""The repair queue of the simulated job: nodes in repair, hot spares, shrinking or waiting.

A lost node is in repair for ``repair_s``; at every node-losing failure the world-size policy says
whether the job can run with the nodes in repair (spares step in, an elastic job shrinks) or must
wait for the earliest repair that makes it runnable. ``repair_queue`` takes the window over all
cycles at once (exact while nobody waits); ``sequential_waits`` walks the cycles of the trials that
did wait, since a wait moves every later failure.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .policies import WorldSizer

BLOCK_ROWS = 64  # trials per block of the loss-by-loss waits, at least
STEP_CELLS = 8192  # trials x losses per step of the loss-by-loss waits, at least
CHECK_EVERY = 512  # losses between checks whether every trial is past the horizon


def repair_queue(
    sizer: WorldSizer, repair_s: float, spares: int, t_loss: np.ndarray, row: np.ndarray, rows: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Nodes in repair at each node-losing failure, assuming nobody waits. ``t_loss`` holds the times of
    the node losses, trial by trial and in time order within a trial; ``row`` each one's trial.

    Returns (per trial, whether its job ever had to wait for a repaired node, so that the assumption
    fails for it; the positions in ``t_loss`` after which the job runs at a smaller share; those
    shares)."""
    must = np.zeros(rows, dtype=bool)
    none = np.zeros(0, dtype=np.int64)
    if len(t_loss) <= spares:
        return must, none, np.zeros(0)
    # one flat axis with a gap between trials longer than any time plus the repair, so they never mix
    key = t_loss + row * (2.0 * (float(t_loss.max()) + repair_s + 1.0))
    back = key - repair_s  # a loss at or before this time is back from repair at this loss
    # more than ``spares`` nodes in repair at loss i <=> the loss ``spares`` places earlier is still in
    # repair (times are in order within a trial; the gap keeps an earlier trial's losses out): a
    # window test at every loss, the exact count only where it passes
    i = np.arange(spares, len(t_loss))
    over = i[key[i - spares] > back[i]]
    if not len(over):
        return must, none, np.zeros(0)
    first_run, _ = sizer.share(spares + 1)
    if not first_run:  # fewer nodes never run where more do not: every window over the spares waits
        must[row[over]] = True
        return must, none, np.zeros(0)
    o = over + 1 - np.searchsorted(key, back[over], side="right")  # nodes in repair, this one included
    lut_run, lut_share = sizer.table(o)
    must[row[over[~lut_run[o]]]] = True
    runs = lut_run[o]
    return must, over[runs], lut_share[o[runs]]


def sequential_waits(
    sizer: WorldSizer,
    repair_s: float,
    spares: int,
    horizon: float,
    e: np.ndarray,
    det: np.ndarray,
    lost: np.ndarray,
    end: np.ndarray | None = None,
    *,
    by_loss: bool = True,
) -> tuple[np.ndarray, np.ndarray | None]:
    """(wait, share of each cycle: None when the job runs whole whenever it runs) of trials whose job
    waited for a repaired node, cycle by cycle (a
    wait moves every later failure, so the window cannot be taken at once). ``by_loss``: a job that
    never shrinks takes ``fixed_waits`` (False: the cycle-by-cycle walk, which it must agree with)."""
    if by_loss and not sizer.share(spares + 1)[0]:  # one node over the spares stops the job: the waits alone
        return fixed_waits(repair_s, spares, horizon, e, det, lost, end), None
    rows, cols = e.shape
    e_t, d_t, l_t = np.ascontiguousarray(e.T), np.ascontiguousarray(det.T), np.ascontiguousarray(lost.T)
    wait_t = np.zeros((cols, rows), dtype=e.dtype)
    share_t = np.ones((cols, rows), dtype=e.dtype)
    cap = 64  # a power of two: ring positions are counters & (cap - 1)
    ret = np.full(rows * cap, np.inf)  # per row a ring of repair completion times, in order (flat)
    head = np.zeros(rows, dtype=np.int64)  # counters of node losses back from repair / in total
    tail = np.zeros(rows, dtype=np.int64)
    t = np.zeros(rows)
    base = np.arange(rows) * cap
    top = spares + 1  # the tables are filled for every count up to here
    lut_run, lut_share = sizer.table(np.arange(top + 1))
    for i in range(cols):
        if i % 64 == 0 and (t >= horizon).all():
            break
        tf = t + e_t[i] + d_t[i]
        li = l_t[i] & (e_t[i] < horizon - t)
        # np.count_nonzero, not .any(): this loop runs once per cycle, and the call's overhead counts
        losses = np.count_nonzero(li)
        if losses:
            if int((tail - head).max()) >= cap:  # grow the ring, keeping every row's order
                new = np.full(rows * 2 * cap, np.inf)
                new_base = np.arange(rows) * 2 * cap
                for k in range(cap):
                    idx = head + k
                    new[new_base + (idx & (2 * cap - 1))] = ret[base + (idx & (cap - 1))]
                ret, cap, base = new, 2 * cap, new_base
            r = np.flatnonzero(li)
            ret[base[r] + (tail[r] & (cap - 1))] = tf[r] + repair_s
            tail[r] += 1
        while True:  # slots outside [head, tail) hold inf, so no bounds check is needed
            pos = base + (head & (cap - 1))
            adv = ret[pos] <= tf
            if not np.count_nonzero(adv):
                break
            ret[pos[adv]] = np.inf
            head += adv
        if losses:
            out = tail - head
            over = li & (out > spares)
            if np.count_nonzero(over):
                r = np.flatnonzero(over)
                o = out[r]
                if int(o.max()) > top:
                    top = int(o.max())
                    lut_run, lut_share = sizer.table(np.arange(top + 1))
                ok = lut_run[o]
                share_t[i, r[ok]] = lut_share[o[ok]]
                w_rows = r[~ok]
                if len(w_rows):
                    w = ret[base[w_rows] + ((head[w_rows] + o[~ok] - spares - 1) & (cap - 1))] - tf[w_rows]
                    wait_t[i, w_rows] = w
                    tf[w_rows] += w
        t = tf
    share = np.ones((rows, cols), dtype=e.dtype)
    share[:, 1:] = share_t.T[:, :-1]  # a shrunk job runs the next cycle at the smaller size
    return np.ascontiguousarray(wait_t.T), share


def fixed_waits(
    repair_s: float,
    spares: int,
    horizon: float,
    e: np.ndarray,
    det: np.ndarray,
    lost: np.ndarray,
    end: np.ndarray | None = None,
) -> np.ndarray:
    """The waits of trials whose job cannot run with more nodes in repair than spares (it never
    shrinks), loss by loss instead of cycle by cycle (``fixed_waits_of`` for one array of trials).
    ``end``: the cumulative sums of ``e + det`` along the cycles (float64), when the caller has them."""
    done = np.cumsum((e + det).astype(np.float64), axis=1) if end is None else end
    return np.concatenate(fixed_waits_of(repair_s, spares, horizon, [Piece(e, det, lost, done)]))


class Piece(NamedTuple):
    """Some trials' cycles: failure offsets, detection, node lost, cycle ends without waits (float64)."""

    e: np.ndarray
    det: np.ndarray
    lost: np.ndarray
    done: np.ndarray


def fixed_waits_of(repair_s: float, spares: int, horizon: float, pieces: list[Piece]) -> list[np.ndarray]:
    """The waits of each piece's trials (of the same width), for a job that never shrinks.

    Repairs take the same time, so nodes come back in the order they were lost, and at the k-th
    node loss (detected at X_k) more than ``spares`` nodes are in repair exactly when the loss
    ``spares`` places earlier is still in repair; the job then waits until it is back:
    ``w_k = max(0, X_{k-S} + R - X_k)``. Writing X_k = C_k + Z_{k-1}, with C_k the detection time
    without waits and Z the waits so far, gives ``Z_k = max(Z_{k-1}, C_{k-S} + R - C_k + Z_{k-S-1})``.
    The second term only reads waits at least S + 1 losses back, so S + 1 losses at a time it is known
    for all of them and Z over them is a running maximum: one ``fmax.accumulate`` per S + 1 losses.
    Losses after the horizon change only what comes after it.

    Trials go a block at a time (a block's losses stay cached), more of them per block when few
    losses go per step (few spares), so that each step still works on thousands of values; the
    pieces are never concatenated."""
    step = max(BLOCK_ROWS, -(-STEP_CELLS // (spares + 1)))
    cut = [
        (i, Piece(*(a[lo : lo + step] for a in p)))
        for i, p in enumerate(pieces)
        for lo in range(0, len(p.e), step)
    ]
    out: list[list[np.ndarray]] = [[] for _ in pieces]  # a piece longer than a block comes back in parts
    block: list[tuple[int, Piece]] = []
    for j, (i, p) in enumerate(cut):
        block.append((i, p))
        if sum(len(b.e) for _, b in block) >= step or j == len(cut) - 1:
            done = _block_waits(repair_s, spares, horizon, [b for _, b in block])
            for (owner, _), w in zip(block, done, strict=True):
                out[owner].append(w)
            block = []
    return [w[0] if len(w) == 1 else np.concatenate(w) for w in out]


def _block_waits(repair_s: float, spares: int, horizon: float, block: list[Piece]) -> list[np.ndarray]:
    """``fixed_waits_of`` one block of trials."""
    waits = [np.zeros(p.e.shape, dtype=p.e.dtype) for p in block]
    flats = [np.flatnonzero(p.lost) for p in block]  # each trial's losses (a mask is slower here)
    counts = [np.count_nonzero(p.lost, axis=1) for p in block]
    count = np.concatenate(counts)
    rows, n = len(count), int(count.max())
    if n <= spares:
        return waits
    # the losses as a padded (losses x trials) table: loss k of every trial in one contiguous row, so
    # that each step works on whole rows; NaN past a trial's last loss, which fmax skips. Filled trial
    # by trial (writes in order), then transposed (a copy that reads each cache line in one go).
    by_trial = np.full((rows, n), np.nan)
    cells, firsts, r0 = [], [], 0
    for p, flat, cnt in zip(block, flats, counts, strict=True):
        first = np.zeros(len(cnt), dtype=np.int64)
        np.cumsum(cnt[:-1], out=first[1:])  # each trial's first loss in ``flat``
        cell = np.arange(len(flat), dtype=np.int64)  # loss i of trial r goes to (r, i - first[r])
        cell += np.repeat((np.arange(len(cnt), dtype=np.int64) + r0) * n - first, cnt)
        by_trial.ravel()[cell] = p.done.ravel()[flat]  # detection times without waits
        cells.append(cell)
        firsts.append(first)
        r0 += len(cnt)
    c = np.ascontiguousarray(by_trial.T)
    del by_trial
    z = np.zeros((n + 1, rows))  # z[k + 1] = waits up to and including loss k; z[0] = 0
    s = spares
    top = (
        max(float(np.max(p.det)) for p in block) + 1.0
    )  # detected this much after the horizon: failed after it
    safe = 0  # every loss before this one was detected ``top`` or more before the horizon
    for k0 in range(s, n, s + 1):  # losses k0..k1-1 read waits up to loss k0 - 1 only
        k1 = min(n, k0 + s + 1)
        if (k0 - s) % CHECK_EVERY < s + 1:  # detection times (with waits) only grow along a trial
            seen = c[k0] + z[k0]
            if not np.any(seen - top < horizon):
                z[k0 + 1 :] = z[k0]  # every trial is past the horizon: no wait from here on
                break
            if not np.any(seen >= horizon - top):
                safe = k0
        gap = c[k0 - s : k1 - s] - c[k0:k1]  # C_{k-S} - C_k
        gap += repair_s
        gap += z[k0 - s : k1 - s]  # + Z_{k-S-1}
        np.fmax(gap[0], z[k0], out=gap[0])
        np.fmax.accumulate(gap, axis=0, out=z[k0 + 1 : k1 + 1])
    w = np.diff(z, axis=0)  # the wait at each loss
    # a failure drawn after the horizon never happens (its cycle started too late): no wait there.
    # Detected ``top`` or more before the horizon, a loss failed before it; ``top`` or more after,
    # after it; the few in between are tested exactly
    seen = c[safe:] + z[safe:n]  # detection time with waits (NaN past a trial's last loss)
    w[safe:][~(seen < horizon + top)] = 0.0
    near = np.flatnonzero((seen >= horizon - top) & (seen < horizon + top)) + safe * rows
    k, r = np.divmod(near, rows)
    r0 = 0
    for p, flat, first in zip(block, flats, firsts, strict=True):
        mine = (r >= r0) & (r < r0 + len(first))
        at = flat[first[r[mine] - r0] + k[mine]]  # the loss's cycle
        offset, d = p.e.take(at), p.det.take(at)
        start = c.take(near[mine]) - (offset + d) + z.take(near[mine])
        w.ravel()[near[mine][~(offset < horizon - start)]] = 0.0
        r0 += len(first)
    w_by_trial = np.ascontiguousarray(w.T).ravel()
    for wt, flat, cell in zip(waits, flats, cells, strict=True):
        wt.ravel()[flat] = w_by_trial[cell].astype(wt.dtype)
    return waits
