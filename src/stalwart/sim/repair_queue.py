"""The repair queue of the simulated job: nodes in repair, hot spares, shrinking or waiting.

A lost node is in repair for ``repair_s``; at every node-losing failure the world-size policy says
whether the job can run with the nodes in repair (spares step in, an elastic job shrinks) or must
wait for the earliest repair that makes it runnable. ``repair_queue`` takes the window over all
cycles at once (exact while nobody waits); ``sequential_waits`` walks the cycles of the trials that
did wait, since a wait moves every later failure.
"""

from __future__ import annotations

import numpy as np

from .policies import WorldSizer

BLOCK = 512  # losses per block of the loss-by-loss walk (a block of every trial's times stays cached)


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
) -> tuple[np.ndarray, np.ndarray | None]:
    """(wait, share of each cycle: None when the job runs whole whenever it runs) of trials whose job
    waited for a repaired node, cycle by cycle (a
    wait moves every later failure, so the window cannot be taken at once)."""
    if not sizer.share(spares + 1)[0]:  # one node over the spares stops the job: the waits alone
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
    shrinks), loss by loss instead of cycle by cycle.

    Repairs take the same time, so nodes come back in the order they were lost, and at the k-th
    node loss (detected at X_k) more than ``spares`` nodes are in repair exactly when the loss
    ``spares`` places earlier is still in repair; the job then waits until it is back:
    ``w_k = max(0, X_{k-S} + R - X_k)``. Writing X_k = C_k + Z_{k-1}, with C_k the detection time
    without waits and Z the waits so far, gives ``Z_k = max(Z_{k-1}, C_{k-S} + R - C_k + Z_{k-S-1})``:
    one step per node loss, two array operations over the trials. Losses after the horizon change
    only what comes after it. ``end``: the cumulative sums of ``e + det`` along the cycles (float64),
    when the caller has them."""
    rows, cols = e.shape
    where = [np.flatnonzero(lost[r]) for r in range(rows)]  # row by row: no index array of every loss
    n = max(len(ix) for ix in where)
    if n <= spares:
        return np.zeros((rows, cols), dtype=e.dtype)
    # every trial's losses as a padded (trials x losses) table of their cycles; padding points at an
    # extra cycle past the last, so that it never lands on a real one
    pos = np.full((rows, n), cols, dtype=np.int32 if cols < 2**31 - 1 else np.int64)
    for r, ix in enumerate(where):
        pos[r, : len(ix)] = ix
    real = pos < cols
    at = np.minimum(pos, cols - 1)  # where to read (the padding's values are masked)
    done = np.cumsum(e + det, axis=1, dtype=np.float64) if end is None else end
    by_row = np.take_along_axis(done, at, axis=1)  # detection times without waits
    by_row[~real] = np.nan
    z = np.zeros((n + 1, rows))  # z[k + 1] = waits up to and including loss k; z[0] = 0
    zt = np.zeros((rows, n + 1))  # the same, trial by trial
    gap = np.empty(rows)
    s = spares
    for k0 in range(s, n, BLOCK):  # losses k0..k1-1; each step reads two losses of every trial
        k1 = min(n, k0 + BLOCK)
        c = np.ascontiguousarray(by_row[:, k0 - s : k1].T)  # c[j] = loss k0 - s + j, a block at a time
        if not np.any(c[s] + z[k0] < horizon):  # every trial is past the horizon
            z[k0 + 1 :] = z[k0]  # no wait from here on: nothing after the horizon is booked
            zt[:, k0 + 1 :] = z[k0][:, None]
            break
        ahead = c[: k1 - k0] - c[s:]  # C_{k-S} - C_k for the block's losses
        ahead += repair_s
        for j, k in enumerate(range(k0, k1)):
            np.add(ahead[j], z[k - s], out=gap)
            np.fmax(z[k], gap, out=z[k + 1])
        zt[:, k0 + 1 : k1 + 1] = z[k0 + 1 : k1 + 1].T
    del z, c, gap
    w = np.diff(zt, axis=1)  # the wait at each loss
    # a failure drawn after the horizon never happens (its cycle started too late): no wait there
    offset = np.take_along_axis(e, at, axis=1)
    start = by_row  # reused in place: the start of each loss's cycle
    start -= offset + np.take_along_axis(det, at, axis=1)
    start += zt[:, :n]
    del zt, at
    w[~(real & (offset < horizon - start))] = 0.0
    del start, offset, real
    waits = np.zeros((rows, cols + 1), dtype=e.dtype)
    np.put_along_axis(waits, pos, w.astype(e.dtype, copy=False), axis=1)
    return waits[:, :cols]
