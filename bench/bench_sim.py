"""Simulator cost: 16,384 GPUs x 54 days x 1,000 trials (target < 2 s on 2 cores), 100,000 GPUs x 1 year,
and how wall time grows with GPUs, days and trials. Ratios are against the baseline measured in this run
(16,384 GPUs, 54 days, 1,000 trials).

    .venv/bin/python bench/bench_sim.py
"""

from __future__ import annotations

import os
import platform
import time

from stalwart.sim import SimConfig, simulate


def timed(**kw: object) -> tuple[float, float, int]:
    best = float("inf")
    for _ in range(3 if kw.get("gpus", 0) <= 32768 else 1):
        t0 = time.perf_counter()
        r = simulate(SimConfig(**kw))
        best = min(best, time.perf_counter() - t0)
    return best, float(r.ettr.mean()), r.iterations


def main() -> None:
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}"
    )
    base_s, base_ettr, base_it = timed(gpus=16384, days=54, trials=1000)
    print(
        f"baseline 16,384 GPUs x 54 d x 1,000 trials: {base_s:.3f} s  (ETTR {base_ettr:.3f}, {base_it} iterations)"
    )
    rows = []
    for gpus in (4096, 16384, 65536, 100000):
        rows.append(("gpus", gpus, *timed(gpus=gpus, days=54, trials=1000)))
    for days in (14, 54, 108, 365):
        rows.append(("days", days, *timed(gpus=16384, days=days, trials=1000)))
    for trials in (100, 1000, 10000):
        rows.append(("trials", trials, *timed(gpus=16384, days=54, trials=trials)))
    rows.append(("100k x 1 year, 1000 trials", 100000, *timed(gpus=100000, days=365, trials=1000)))
    rows.append(
        (
            "100k x 1 year + 64 spares, elastic",
            100000,
            *timed(gpus=100000, days=365, trials=1000, spare_nodes=64, elastic=True),
        )
    )
    print(f"{'vary':38s} {'value':>8s} {'seconds':>8s} {'x base':>7s} {'ETTR':>6s} {'iters':>6s}")
    for what, value, s, e, it in rows:
        print(f"{what:38s} {value:>8} {s:8.3f} {s / base_s:7.2f} {e:6.3f} {it:6d}")


if __name__ == "__main__":
    main()
