"""The checkpoint schedule's phase carried from cycle to cycle (docs/simulator.md).

A training loop saves when its step counter reaches a multiple of the interval, so the schedule is
fixed in the job's progress, not in the time since the last recovery. After a whole-group restart
the job resumes at its newest checkpoint, a multiple of the fastest interval, and with one tier the
next save then comes one interval later: every run phase starts at phase 0, which is what
:func:`~stalwart.sim.cycles.run_split` books, all cycles at once. A recovery that keeps the state
(in place, from a live replica) resumes mid-interval instead: the next save comes when the progress
reaches the next multiple, however short the run phase. Booking each of those run phases from phase
0 misses the saves that fall in them, and a later rollback loses the progress those cycles kept
since the newest committed checkpoint, not only its own cycle's.

:func:`carried` walks the cycles of each chain of such recoveries in order, all chains at once, with
the job's progress (compute seconds), its newest committed checkpoint and its newest checkpoint that
survives a node loss. A save whose persist a failure cut short never committed: the recovery drops it
(a re-formed group builds a new checkpoint engine), so it is not rolled back to, and the progress
does not save again at the same multiple. A planned stop ends a chain and the next run phase starts
at phase 0 (its checkpoint taken as on a multiple): exact, it would need chains that go on past a
rollback to that checkpoint, which only the walk itself can tell.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .cycles import run_split
from .model import Schedule

_EPS = 1e-6  # of an interval: a progress this close to a multiple is on it


@dataclass(frozen=True)
class Split:
    """Per cycle: compute seconds, base checkpoints completed, their stall seconds, and the progress
    the cycle kept (negative when its rollback loses what earlier in-place cycles kept)."""

    compute: np.ndarray
    n_ckpt: np.ndarray
    stalled: np.ndarray
    kept: np.ndarray


def _at(
    sch: Schedule, ends: np.ndarray, progress: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Where the schedule stands at ``progress``: (saves behind it, the same within the super-cycle,
    the wall offset into the super-cycle, the compute offset into it). A progress on a multiple of the
    fastest interval has that multiple's save behind it (made, or cut short and dropped). ``ends``:
    the wall offset at the end of the m-th stall, 0 for m = 0."""
    k = len(sch.stall_end)
    nearest = np.rint(progress / sch.base)
    on = np.abs(progress - nearest * sch.base) <= _EPS * sch.base
    done = np.where(on, nearest, np.floor(progress / sch.base))
    if k == 1:  # one tier: every multiple ends a super-cycle
        offset = np.where(on, 0.0, progress - done * sch.base)
        return done, np.zeros(len(done), dtype=np.int64), offset, offset
    turns = np.floor(done / k)
    within = (done - turns * k).astype(np.int64)
    offset = progress - turns * sch.period_compute
    # on a multiple: exactly the end of its stall, so that run_split counts that save as behind
    wall = np.where(on, ends[within], offset + sch.stall_cum[within])
    return done, within, wall, np.where(on, within * sch.base, offset)


def _chains(keeps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The chains of cycles whose phase is carried, longest first: (trial, first cycle, length). A
    chain starts at a cycle whose failure keeps the progress and that starts at phase 0 (the first
    cycle, or one after a cycle that does not keep it), and runs to the next cycle that does not keep
    it (included): a rollback, a planned stop, or the cycle the horizon cuts."""
    rows, cols = keeps.shape
    idx = np.arange(cols)
    starts = keeps.copy()
    starts[:, 1:] &= ~keeps[:, :-1]
    r, first = np.nonzero(starts)
    # each cycle's next cycle (itself included) that does not keep the progress, else the last cycle
    stop = np.minimum.accumulate(np.where(keeps, cols - 1, idx)[:, ::-1], axis=1)[:, ::-1]
    length = stop[r, first] - first + 1
    order = np.argsort(-length, kind="stable")
    return r[order], first[order], length[order]


def carried(
    sch: Schedule, x: np.ndarray, keeps: np.ndarray, rolls: np.ndarray, lost: np.ndarray, at_zero: Split
) -> Split:
    """``at_zero`` (every cycle booked from phase 0) with the chains of cycles whose phase is carried
    booked again, each from the progress its cycles start at.

    ``keeps``: the cycle's failure keeps the progress (a recovery in place, a live replica);
    ``rolls``: it rolls the job back to its newest committed checkpoint (``lost``: a node loss, to the
    newest one that survives it). A chain's cycles are walked in order, all chains at once: as many
    passes as the longest chain has cycles. Positions count from the checkpoint the chain starts at,
    which is where the cycle before it left the job (a rollback's checkpoint, a planned stop's, or
    the start), taken at phase 0 as run_split does."""
    compute, n_ckpt = at_zero.compute.copy(), at_zero.n_ckpt.copy()
    stalled, kept = at_zero.stalled.copy(), at_zero.kept.copy()
    rows_of, first, length = _chains(keeps)
    n = len(first)
    progress, newest, durable = np.zeros(n), np.zeros(n), np.zeros(n)
    every = sch.durable_every * sch.base
    ends = np.concatenate(([0.0], sch.stall_end))
    # the cells by flat index (a chain's cells follow one another in its row): one-dimensional takes
    # and puts, the cheapest numpy has for scattered cells
    cell0 = rows_of.astype(np.int64) * x.shape[1] + first
    xs, back, safe_back = np.ravel(x), np.ravel(rolls), np.ravel(lost)
    outs = (np.ravel(compute), np.ravel(n_ckpt), np.ravel(stalled), np.ravel(kept))
    any_lost = bool(lost.any())
    for depth in range(int(length[0]) if n else 0):
        live = int(np.count_nonzero(length > depth))  # longest first: the live chains are a prefix
        cell = cell0[:live] + depth
        p = progress[:live]
        xc = xs.take(cell).astype(np.float64)
        done0, n0, wall0, c0 = _at(sch, ends, p)
        c1, n1, s1 = run_split(sch, wall0 + xc)
        comp = c1 - c0
        outs[0][cell], outs[1][cell], outs[2][cell] = comp, n1 - n0, s1 - sch.stall_cum[n0]
        # the saves of this cycle whose persist finished: the newest is the newest to roll back to
        if sch.persist > 0:
            n_ok = run_split(sch, wall0 + np.maximum(xc - sch.persist, 0.0))[1] - n0
        else:
            n_ok = n1 - n0
        saved = n_ok > 0
        committed = (done0 + n_ok) * sch.base
        last = np.where(saved, committed, newest[:live])
        if sch.durable_every > 1:  # the newest save that survives a node loss lags the newest
            on_durable = np.floor(committed / every + _EPS) * every
            safe = durable[:live]
            safe = np.where(saved & (on_durable > safe + _EPS * sch.base), on_durable, safe)
        else:
            safe = last
        target = np.where(safe_back.take(cell), safe, last) if any_lost else last
        after = np.where(back.take(cell), target, p + comp)
        outs[3][cell] = after - p
        progress[:live], newest[:live], durable[:live] = after, last, safe
    return Split(compute, n_ckpt, stalled, kept)
