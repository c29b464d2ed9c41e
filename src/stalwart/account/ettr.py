"""Closed forms for checkpoint/restart: optimum intervals, expected ETTR, expected lost work.

The optimum intervals' arithmetic is :mod:`stalwart.policy.checkpoint_interval`'s; here its inputs
are checked (a bad one is a :class:`ConfigError` naming it).

All times are in seconds. Failures are a Poisson process with mean time between failures ``mtbf_s``
(the *job's* MTBF: the whole job stops when any part fails). Sources:

* Young, J. W. "A first order approximation to the optimum checkpoint interval", CACM 17(9), 1974:
  ``tau = sqrt(2 * delta * M)``.
* Daly, J. T. "A higher order estimate of the optimum checkpoint interval for restart dumps",
  Future Generation Computer Systems 22(3), 2006: the expected wall time of a run with Poisson
  failures that can also strike during checkpoints and restarts,
  ``T_w = M * exp(R/M) * (exp((tau + delta)/M) - 1) * T_s / tau``, and its perturbation optimum
  ``tau = sqrt(2 delta M) * (1 + sqrt(delta/(2M))/3 + (delta/(2M))/9) - delta`` for ``delta < 2M``,
  ``tau = M`` otherwise.
* Kokolis et al., "Revisiting Reliability in Large-Scale Machine Learning Research Clusters",
  HPCA 2025 (arXiv 2410.21680): ETTR (effective training time ratio = productive training time /
  wall-clock time) and a first-order expected-ETTR model in which every failure of an N-node job
  (node failure rate ``r_f`` per node-day) costs the restart overhead plus, on average, half a
  checkpoint interval of re-done work. :func:`expected_ettr_first_order` is our first-order form of
  that model, with the checkpoint stall added as a separate term; see docs/accounting.md.
"""

from __future__ import annotations

import math

from ..errors import ConfigError
from ..policy import checkpoint_interval

SECONDS_PER_DAY = 86400.0


def _positive(name: str, value: float, *, allow_zero: bool = False) -> float:
    v = float(value)
    if math.isnan(v) or v < 0 or (v == 0 and not allow_zero) or math.isinf(v):
        need = "non-negative" if allow_zero else "positive"
        raise ConfigError(
            f"{name} must be a finite {need} number of seconds, got {value!r}",
            "check the units: every time here is in seconds",
        )
    return v


def young_interval(ckpt_s: float, mtbf_s: float) -> float:
    """Young (1974) first-order optimum compute time between checkpoints: sqrt(2 delta M)."""
    return checkpoint_interval.young_interval(_positive("checkpoint time", ckpt_s), _positive("MTBF", mtbf_s))


def daly_interval(ckpt_s: float, mtbf_s: float) -> float:
    """Daly (2006) higher-order optimum compute time between checkpoints."""
    return checkpoint_interval.daly_interval(_positive("checkpoint time", ckpt_s), _positive("MTBF", mtbf_s))


def daly_wall_time(work_s: float, interval_s: float, ckpt_s: float, restart_s: float, mtbf_s: float) -> float:
    """Daly (2006) expected wall time to finish ``work_s`` of compute, failures strike anywhere.

    Assumes exponential failures, every failure loses the work since the last completed checkpoint,
    a restart of fixed length ``restart_s`` (itself interruptible), and ``work_s >> interval_s``.
    """
    ts = _positive("work", work_s)
    tau = _positive("checkpoint interval", interval_s)
    d = _positive("checkpoint time", ckpt_s, allow_zero=True)
    r = _positive("restart time", restart_s, allow_zero=True)
    m = _positive("MTBF", mtbf_s)
    return m * math.exp(r / m) * math.expm1((tau + d) / m) * ts / tau


def daly_ettr(interval_s: float, ckpt_s: float, restart_s: float, mtbf_s: float) -> float:
    """Expected ETTR under Daly's model: work / expected wall time (independent of the work)."""
    return 1.0 / daly_wall_time(1.0, interval_s, ckpt_s, restart_s, mtbf_s) if interval_s > 0 else 0.0


def daly_numeric_optimum(ckpt_s: float, restart_s: float, mtbf_s: float) -> float:
    """The interval that minimises :func:`daly_wall_time`, by golden-section search (for checks)."""
    _positive("MTBF", mtbf_s)
    lo, hi = 1e-6 * mtbf_s, 10.0 * mtbf_s
    # the objective is unimodal in log(tau): search there
    a, b = math.log(lo), math.log(hi)
    g = (math.sqrt(5.0) - 1.0) / 2.0

    def f(logt: float) -> float:
        return daly_wall_time(1.0, math.exp(logt), ckpt_s, restart_s, mtbf_s)

    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(200):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    return math.exp((a + b) / 2.0)


def expected_lost_work(interval_s: float, ckpt_s: float = 0.0) -> float:
    """Expected work re-done after one failure: half a checkpoint cycle (uniform failure time)."""
    tau = _positive("checkpoint interval", interval_s)
    d = _positive("checkpoint time", ckpt_s, allow_zero=True)
    return (tau + d) / 2.0


def job_mtbf_s(num_nodes: int, failures_per_node_day: float) -> float:
    """Job MTBF in wall-clock seconds when every node fails independently at the given rate."""
    if num_nodes <= 0:
        raise ConfigError(f"number of nodes must be positive, got {num_nodes}")
    if not failures_per_node_day > 0:
        raise ConfigError(
            f"failure rate must be positive (failures per node-day), got {failures_per_node_day}"
        )
    return SECONDS_PER_DAY / (num_nodes * failures_per_node_day)


def expected_ettr_first_order(
    num_nodes: int,
    failures_per_node_day: float,
    interval_s: float,
    restart_s: float,
    ckpt_s: float = 0.0,
) -> float:
    """First-order expected ETTR (after Kokolis et al. 2024): each failure costs restart + tau/2.

    ``ETTR ~ (1 - lambda * (restart + tau/2)) * tau / (tau + delta)`` with ``lambda = N r_f`` per
    second, clipped to [0, 1]. Valid when ``lambda * (restart + tau) << 1``; beyond that use
    :func:`daly_ettr` or the simulator.
    """
    lam = 1.0 / job_mtbf_s(num_nodes, failures_per_node_day)
    tau = _positive("checkpoint interval", interval_s)
    r = _positive("restart time", restart_s, allow_zero=True)
    d = _positive("checkpoint time", ckpt_s, allow_zero=True)
    value = (1.0 - lam * (r + tau / 2.0)) * tau / (tau + d)
    return min(1.0, max(0.0, value))
