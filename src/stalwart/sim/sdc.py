"""How often replicas should compare their state: the silent-data-corruption trade-off (pure).

A cross-replica check (docs/sdc.md) costs ``check_s`` every N steps; a corruption that lands between
two checks trains on, polluting every replica through the gradient all-reduce, until the next check
finds it, so on average half an interval of work is lost on top of the rollback to the last clean
checkpoint (which does not depend on N). Per second of training, with ``rate`` corruptions a second
for the job:

    overhead(N) = check_s / (N * step_s)        late detection(N) = rate * N * step_s / 2

Their sum is smallest at ``N* * step_s = sqrt(2 * check_s / rate)`` (the square-root law Young and
Daly give checkpoint intervals). The check's budget (``--sdc-budget``, 1% of step time by default)
bounds N from below, and every checkpoint save checks anyway, so N never needs to exceed the
checkpoint interval.

The rate is Llama 3's: 6 of the 419 unexpected interruptions of its 54-day, 16,384-GPU run were
silent data corruption (Llama Team, arXiv 2407.21783, Table 5; ``sim/config.py``'s default mix). The
check's cost is one pass over the rank's training state (the exact fingerprint is a sum over every
element's bits) at ``pass_gbps`` plus one small all-gather, ``GATHER_S``: both our assumptions, to be
replaced by ``bench/sdc_overhead.py``'s figure for the real device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..policy.sdc import check_interval
from .config import LLAMA3_DAYS, LLAMA3_GPUS, LLAMA3_TABLE5

SDC_CLASS = "silent_data_corruption"
GATHER_S = 0.002  # one all-gather of a few hundred int64 (our assumption: a latency-bound collective)
DEFAULT_PASS_GBPS = 1000.0  # one read of the state on an H100 (3.35 TB/s HBM3), at under a third: ours


def found_after_s(
    every: int,
    budget: float,
    step_s: float | None,
    check_s: float | None,
    checkpoint_every_s: float = math.inf,
) -> float | None:
    """Mean time from a corruption to the replica check that finds it: half the interval between
    checks, N steps (``every``, or with ``every`` 0 the interval the ``budget`` allows a check of
    ``check_s``), and never longer than the checkpoint interval (a save checks too). None when the
    interval is not known: checks off (``every`` -1), or no step time, or no check cost to size it."""
    if every < 0 or step_s is None:
        return None
    if every > 0:
        steps = every
    elif check_s is not None:
        steps = check_interval(check_s, step_s, budget)
    else:
        return None
    return min(steps * step_s, checkpoint_every_s) / 2


def sdc_per_gpu_s() -> float:
    """Silent data corruptions per GPU-second in Llama 3's run."""
    count = next(c for name, c, _, _ in LLAMA3_TABLE5 if name == SDC_CLASS)
    return count / (LLAMA3_GPUS * LLAMA3_DAYS * 86400.0)


def check_seconds(state_bytes: float, pass_gbps: float = DEFAULT_PASS_GBPS) -> float:
    """One check: a pass over ``state_bytes`` of training state and one small gather."""
    return state_bytes / (pass_gbps * 1e9) + GATHER_S


@dataclass(frozen=True)
class SdcAdvice:
    interval_steps: int  # check the replicas every this many steps
    overhead: float  # share of training time the checks take
    detect_s: float  # mean time from a corruption to its detection
    lost_per_day_s: float  # expected training seconds a day redone for late detection
    reason: str


def advise(
    check_s: float, step_s: float, gpus: int, *, budget: float = 0.01, checkpoint_every_s: float = math.inf
) -> SdcAdvice:
    """Every how many steps the replicas of a ``gpus``-GPU job with ``step_s`` steps should compare
    their state when one check costs ``check_s``."""
    if check_s <= 0 or step_s <= 0 or gpus <= 0 or not 0 < budget < 1:
        raise ValueError("check_s, step_s and gpus must be positive, and budget a share in (0, 1)")
    rate = sdc_per_gpu_s() * gpus
    floor = check_interval(check_s, step_s, budget)  # the budget's bound, as the running check sets it
    best = max(1, round(math.sqrt(2.0 * check_s / rate) / step_s))  # the square-root law's optimum
    ceiling = (
        max(1, math.floor(checkpoint_every_s / step_s + 1e-9)) if math.isfinite(checkpoint_every_s) else best
    )
    n = max(floor, min(best, ceiling))
    if n == floor and floor > min(best, ceiling):
        why = f"the {budget:.0%} budget allows no more often (the optimum, {best} steps, costs more)"
    elif n == ceiling < best:
        why = "every checkpoint save checks anyway, so no longer than the checkpoint interval"
    else:
        why = "the square-root law's optimum between the checks' cost and late detection"
    interval_s = n * step_s
    overhead = check_s / interval_s
    detect = interval_s / 2.0
    lost = rate * detect * 86400.0
    reason = (
        f"check the replicas every {n} steps ({interval_s:.3g} s): {why}; overhead {overhead:.2%}, a "
        f"corruption found {detect:.3g} s after it on average; at Llama 3's rate ({rate * 86400.0:.3g} a "
        f"day at {gpus:,} GPUs) late detection costs {lost:.3g} s of training a day"
    )
    return SdcAdvice(n, overhead, detect, lost, reason)
