"""What asking the agent's supervisor costs the simulator (sim/agent_probe.py), against the baseline
of this run: the pure policies called directly (what the simulator did before) and one simulation.

    .venv/bin/python bench/bench_sim_probe.py

Prints medians of uncached probes (the caches are cleared before each repetition), the one-time
import of the supervisor, and one default simulation (1,000 trials) for scale.
"""

from __future__ import annotations

import statistics
import sys
import time

REPS = 9


def median_ms(fn) -> float:
    times = []
    for _ in range(REPS):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    from stalwart.policy.restart_policy import Failure, RestartBudget, decide
    from stalwart.policy.timeouts import HangTimeoutPolicy, hang_timeout
    from stalwart.sim import SimConfig, simulate

    t0 = time.perf_counter()
    from stalwart.sim import agent_probe

    import_ms = (time.perf_counter() - t0) * 1e3
    policy = HangTimeoutPolicy()

    def direct_period(budget: RestartBudget) -> int:
        history = []
        for k in range(1, 1_000_000):
            history.append(Failure("crash", k - 1, k, 0, "sim", progressed=True))
            if decide(history, budget).action == "stop":
                return k
        raise RuntimeError("no stop")

    def uncached(fn):
        def run():
            agent_probe.hang_latency.cache_clear()
            agent_probe.restart_stop.cache_clear()
            fn()

        return run

    rows = []
    for step_s in (0.5, 30.0):
        rows.append(
            (
                f"hang latency, step {step_s:g} s",
                median_ms(uncached(lambda s=step_s: agent_probe.hang_latency(s, policy))),
                median_ms(lambda s=step_s: hang_timeout([s] * policy.min_samples, policy)),
            )
        )
    for budget in (3, 100):
        b = RestartBudget(max_restarts=budget)
        rows.append(
            (
                f"restart period, budget {budget}",
                median_ms(uncached(lambda b=b: agent_probe.restart_stop(b))),
                median_ms(lambda b=b: direct_period(b)),
            )
        )
    sim_ms = median_ms(lambda: simulate(SimConfig()))
    print(f"python {sys.version.split()[0]}; medians of {REPS}; uncached probes")
    print(f"{'question':32} {'agent path ms':>14} {'direct ms':>10}")
    for name, new, old in rows:
        print(f"{name:32} {new:14.2f} {old:10.3f}")
    print(f"import of the probe (supervisor, launch config), once per process: {import_ms:.0f} ms")
    print(f"baseline: one default simulate() (16,384 GPUs, 54 days, 1,000 trials): {sim_ms:.0f} ms")


if __name__ == "__main__":
    main()
