"""Loss and gradient-norm anomalies: whether one step's value left its running range (pure).

A second signal of silent data corruption (and of plain training instability) beside the replicas'
fingerprints: a corruption that reaches every replica alike (a bad gradient before the all-reduce)
leaves the replicas identical, but it often shows in the loss or the gradient norm. What counts:

- **not finite**: a NaN or an infinity, at any step (no warm-up needed);
- **a spike**: a value above the running median by more than ``threshold`` robust standard
  deviations (the median absolute deviation, MAD, times 1.4826) *and* by more than ``min_rise`` of
  the median, judged once ``warmup`` values were seen. The median and the MAD follow the last
  ``window`` finite values, so a loss that falls (its median lags above it) never spikes, noise
  moves the MAD with it, and a value far out moves neither;
- **a run of skipped steps**: a step that the AMP gradient scaler skipped (it found inf/NaN
  gradients and lowered its scale) is not an anomaly, and its values are neither judged nor kept;
  ``max_skipped`` skipped steps in a row are (the scale collapses: every step is lost).

The verdict is a signal with its evidence, never an action: the SDK records it
(``train/anomaly_watch.py``) and training goes on. No clock, no I/O, no torch: the unit tests drive
these functions with plain floats.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .label import Label

MAD_TO_SIGMA = 1.4826  # the MAD of a normal distribution times this is its standard deviation
REL_FLOOR = 0.01  # the spread is never taken as less than this share of the median (a flat loss)


class Signal(Label):
    LOSS = "loss"
    GRAD_NORM = "grad_norm"
    SCALER = "scaler"  # the AMP gradient scaler's skipped steps


class AnomalyKind(Label):
    NONE = "none"  # within its range
    WARMING_UP = "warming_up"  # too few values yet to judge a spike
    NONFINITE = "nonfinite"
    SPIKE = "spike"
    SKIP_RUN = "skip_run"  # the scaler skipped this many steps in a row


ANOMALOUS = (AnomalyKind.NONFINITE, AnomalyKind.SPIKE, AnomalyKind.SKIP_RUN)


@dataclass(frozen=True)
class AnomalySettings:
    window: int = 200  # finite values the running estimate follows
    warmup: int = 50  # values seen before a spike is judged
    threshold: float = 6.0  # robust standard deviations above the median
    min_rise: float = 0.2  # and this share of the median at least
    max_skipped: int = 25  # skipped steps in a row (a scale of 2**16 falls below 2**-9)

    def __post_init__(self) -> None:
        if self.window < 3 or not 1 <= self.warmup <= self.window:
            raise ValueError(
                f"anomaly window {self.window}, warm-up {self.warmup}: need window >= 3, 1 <= warm-up <= window"
            )
        if self.threshold <= 0 or self.min_rise < 0 or self.max_skipped < 1:
            raise ValueError("anomaly threshold must be > 0, min_rise >= 0 and max_skipped >= 1")


LOSS_SETTINGS = AnomalySettings()
# a gradient norm is noisier and right-skewed: healthy steps double it now and then
GRAD_NORM_SETTINGS = AnomalySettings(threshold=8.0, min_rise=1.0)


@dataclass(frozen=True)
class Estimate:
    """The running range of a signal: its median and robust spread over ``count`` values."""

    median: float
    mad: float
    count: int

    @property
    def sigma(self) -> float:
        return max(MAD_TO_SIGMA * self.mad, REL_FLOOR * abs(self.median), 1e-12)


NO_ESTIMATE = Estimate(0.0, 0.0, 0)


def _median(sorted_values: Sequence[float]) -> float:
    n = len(sorted_values)
    mid = n // 2
    return sorted_values[mid] if n % 2 else (sorted_values[mid - 1] + sorted_values[mid]) / 2


def estimate(values: Sequence[float]) -> Estimate:
    """Median and MAD of ``values`` (finite ones; the caller keeps only those)."""
    if not values:
        return NO_ESTIMATE
    med = _median(sorted(values))
    return Estimate(med, _median(sorted(abs(v - med) for v in values)), len(values))


@dataclass(frozen=True)
class Judgement:
    signal: Signal
    kind: AnomalyKind
    value: float
    score: float  # robust standard deviations above the median (0 when not judged)
    est: Estimate
    reason: str

    @property
    def anomalous(self) -> bool:
        return self.kind in ANOMALOUS


def judge(value: float, est: Estimate, *, signal: Signal, step: int, cfg: AnomalySettings) -> Judgement:
    """One step's value against the running estimate of the values before it."""
    what = f"{signal.value} at step {step}"
    if not math.isfinite(value):
        why = f"{what} is {value} (not finite)"
        return Judgement(signal, AnomalyKind.NONFINITE, value, 0.0, est, why)
    if est.count < cfg.warmup:
        why = f"{what}: warming up ({est.count}/{cfg.warmup} values)"
        return Judgement(signal, AnomalyKind.WARMING_UP, value, 0.0, est, why)
    score = (value - est.median) / est.sigma
    rise = value - est.median
    if score >= cfg.threshold and rise > cfg.min_rise * abs(est.median):
        why = (
            f"{what} is {value:.4g}, {score:.1f} robust standard deviations above its running median "
            f"{est.median:.4g} (MAD {est.mad:.3g} over the last {est.count} values; spike threshold "
            f"{cfg.threshold:g} and a rise over {cfg.min_rise:.0%})"
        )
        return Judgement(signal, AnomalyKind.SPIKE, value, score, est, why)
    return Judgement(signal, AnomalyKind.NONE, value, score, est, f"{what} within its range")


def judge_skips(skipped_in_a_row: int, *, step: int, cfg: AnomalySettings) -> Judgement:
    """A step the gradient scaler skipped: an anomaly only when ``max_skipped`` came in a row (the
    scale keeps halving: no step trains). Counted once, when the run reaches the limit."""
    if skipped_in_a_row == cfg.max_skipped:
        why = (
            f"the gradient scaler skipped {skipped_in_a_row} steps in a row up to step {step} "
            "(inf/NaN gradients every step: the scale collapses and nothing trains)"
        )
        return Judgement(Signal.SCALER, AnomalyKind.SKIP_RUN, float(skipped_in_a_row), 0.0, NO_ESTIMATE, why)
    why = f"step {step} skipped by the gradient scaler (inf/NaN gradients under AMP): not an anomaly"
    return Judgement(Signal.SCALER, AnomalyKind.NONE, float(skipped_in_a_row), 0.0, NO_ESTIMATE, why)
