"""What the engine computes with: the checkpoint schedule and, per failure class, the rates, costs and
the agent's policies' answers (``Model``, built by ``engine``, which asks the policies)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import SimConfig
from .policies import WorldSizer


@dataclass(frozen=True)
class Schedule:
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


def schedule(cfg: SimConfig) -> Schedule:
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
    return Schedule(
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


@dataclass(frozen=True)
class Model:
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
    # per class (+ planned, False): a failure rolls back to the checkpoint (False: its state comes from
    # a live replica, for a class recovered in place or with SimConfig.no_rollback); None when every
    # class rolls back
    rolls_back: np.ndarray | None = None
    ft: type = np.float64  # dtype of per-cycle quantities


def alias(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
