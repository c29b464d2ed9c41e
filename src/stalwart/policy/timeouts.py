"""Hang timeouts derived from observed step times, and the timeout hierarchy check.

The hang timeout is ``clamp(multiplier x p99(step time), floor, cap)``; before ``min_samples``
steps have been seen the start-up timeout applies. The hierarchy

    heartbeat interval < hang timeout cap < process-group timeout < rendezvous timeout
    monitor interval, rendezvous keep-alive interval < store timeout < rendezvous timeout
    start-up window (the first round's wait for late hosts) < rendezvous timeout
    in-place announce timeout < in-place timeout < process-group timeout

is validated when the agent is configured, so a bad ordering is an error before the job starts
(a process-group timeout shorter than the hang cap would turn every hang into a crash with a
useless NCCL/gloo message; a rendezvous timeout shorter than the PG timeout would give up on
re-forming while the workers are still timing out). The store timeout (``--rdzv-conf read_timeout``)
is how long the rendezvous store may stay silent to this agent's background reads before the silence
is itself the verdict (launch/rendezvous/store_watch.py): above the keep-alive interval, so one late beat is not a
lost store, and below the rendezvous timeout, so the agent never waits on a store that is gone for
longer than it would wait on peers that are late.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ConfigError
from .hang_pin import HOLD_GRACES

# The one default of each hang setting: the agent's (launch.settings.HangSettings), the simulator's
# (it embeds the same model) and this policy's all read these.
HANG_MULTIPLIER = 3.0
HANG_FLOOR_S = 10.0
HANG_CAP_S = 300.0
STARTUP_TIMEOUT_S = 300.0
HANG_MIN_SAMPLES = 5
CPU_STALL_S = 0.0  # the process-group timeout: idleness alone is no evidence of a hang
# how long the rendezvous store may stay silent before that silence ends the job (torch's read_timeout
# default): with the membership reads every second, a verdict about 62 s after the store went away
STORE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class HangTimeoutPolicy:
    multiplier: float = HANG_MULTIPLIER
    floor_s: float = HANG_FLOOR_S
    cap_s: float = HANG_CAP_S
    startup_s: float = STARTUP_TIMEOUT_S
    min_samples: int = HANG_MIN_SAMPLES


@dataclass(frozen=True)
class HangTimeout:
    seconds: float
    p99_s: float
    samples: int
    reason: str
    calibrated: bool


def p99(values: Sequence[float]) -> float:
    """Nearest-rank 99th percentile."""
    if not values:
        raise ValueError("p99 of no values")
    ordered = sorted(values)
    k = max(0, math.ceil(0.99 * len(ordered)) - 1)
    return ordered[k]


def hang_timeout(step_times: Sequence[float], policy: HangTimeoutPolicy) -> HangTimeout:
    """The silence after which a rank counts as hung, with the reason for the value."""
    n = len(step_times)
    if n < policy.min_samples:
        return HangTimeout(
            policy.startup_s,
            0.0,
            n,
            f"start-up timeout {policy.startup_s:g}s "
            f"({n} of {policy.min_samples} steps seen for calibration)",
            False,
        )
    q = p99(step_times)
    raw = policy.multiplier * q
    value = min(max(raw, policy.floor_s), policy.cap_s)
    if value == raw:
        why = f"{policy.multiplier:g} x p99 step time {q:.3f}s"
    elif value == policy.floor_s:
        why = f"floor {policy.floor_s:g}s (> {policy.multiplier:g} x p99 {q:.3f}s)"
    else:
        why = f"cap {policy.cap_s:g}s (< {policy.multiplier:g} x p99 {q:.3f}s)"
    return HangTimeout(value, q, n, f"hang timeout {value:.3f}s = {why} over {n} steps", True)


def validate_hierarchy(
    *,
    monitor_interval_s: float,
    policy: HangTimeoutPolicy,
    pg_timeout_s: float,
    rdzv_timeout_s: float,
    stop_grace_s: float,
    reform_timeout_s: float | None = None,
    announce_s: float | None = None,
    store_timeout_s: float | None = None,
    keepalive_s: float = 0.0,
    startup_window_s: float | None = None,
) -> None:
    """Raise ConfigError naming the first pair of timeouts that is out of order."""
    if policy.floor_s <= 0 or policy.multiplier <= 0:
        raise ConfigError("hang floor and multiplier must be positive")
    if policy.floor_s > policy.cap_s:
        raise ConfigError(
            f"hang floor {policy.floor_s:g}s is above the hang cap {policy.cap_s:g}s",
            "lower --hang-floor or raise --hang-cap",
        )
    checks = [
        (
            "monitor interval",
            monitor_interval_s,
            "hang floor",
            policy.floor_s,
            "--monitor-interval",
            "--hang-floor",
        ),
        ("hang cap", policy.cap_s, "process-group timeout", pg_timeout_s, "--hang-cap", "--pg-timeout"),
        (
            "start-up timeout",
            policy.startup_s,
            "process-group timeout",
            pg_timeout_s,
            "--startup-timeout",
            "--pg-timeout",
        ),
        (
            "process-group timeout",
            pg_timeout_s,
            "rendezvous timeout",
            rdzv_timeout_s,
            "--pg-timeout",
            "--rdzv-timeout",
        ),
    ]
    if reform_timeout_s is not None:  # a survivor gives up on a re-formation before its group times out
        checks.append(
            (
                "in-place timeout",
                reform_timeout_s,
                "process-group timeout",
                pg_timeout_s,
                "--in-place-timeout",
                "--pg-timeout",
            )
        )
        if announce_s is not None:  # a rank waits for the announcement, then for the new group
            checks.append(
                (
                    "in-place announce timeout",
                    announce_s,
                    "in-place timeout",
                    reform_timeout_s,
                    "--in-place-announce-timeout",
                    "--in-place-timeout",
                )
            )
    if store_timeout_s is not None:
        checks += [
            (
                "monitor interval",
                monitor_interval_s,
                "store timeout",
                store_timeout_s,
                "--monitor-interval",
                "--rdzv-conf read_timeout",
            ),
            (
                "rendezvous keep-alive interval",
                keepalive_s,
                "store timeout",
                store_timeout_s,
                "--rdzv-conf keep_alive_interval",
                "--rdzv-conf read_timeout",
            ),
            (
                "store timeout",
                store_timeout_s,
                "rendezvous timeout",
                rdzv_timeout_s,
                "--rdzv-conf read_timeout",
                "--rdzv-timeout",
            ),
        ]
    # a node whose ranks all wait in a collective for a hung rank of another node holds its stop for
    # HOLD_GRACES stop graces (policy/hang_pin.py): before the ranks' own collectives would time out
    checks.append(
        (
            f"hold for a hang on another node ({HOLD_GRACES} x stop grace)",
            HOLD_GRACES * stop_grace_s,
            "process-group timeout",
            pg_timeout_s,
            "--stop-grace",
            "--pg-timeout",
        )
    )
    if startup_window_s:  # the first round's wait for late hosts is part of its rendezvous timeout
        checks.append(
            (
                "start-up window",
                startup_window_s,
                "rendezvous timeout",
                rdzv_timeout_s,
                "--rdzv-startup-window",
                "--rdzv-timeout",
            )
        )
    for a_name, a, b_name, b, a_flag, b_flag in checks:
        if not a < b:
            raise ConfigError(
                f"timeout order violated: {a_name} ({a:g}s) must be shorter than {b_name} ({b:g}s)",
                f"lower {a_flag} or raise {b_flag}",
            )
    if stop_grace_s <= 0:
        raise ConfigError("--stop-grace must be positive")
