"""Simulator cost: 100,000 GPUs x 1 year x 1,000 trials with finite spares (target <= 2 s on 2 cores),
and how wall time grows with GPUs, days, trials and spares. Ratios are against the baseline measured
in this run (16,384 GPUs, 54 days, 1,000 trials, the Llama 3 defaults).

    .venv/bin/python bench/bench_sim.py            # full table
    .venv/bin/python bench/bench_sim.py --quick    # the baseline and the 100k-GPU-year rows only
    .venv/bin/python bench/bench_sim.py --library  # without the allocator setting of the commands

``stalwart sim`` and ``stalwart plan`` keep freed memory in the process (``sim/alloc.py``); the
benchmark does the same unless ``--library`` is given (``simulate`` called from a user's program).
"""

from __future__ import annotations

import os
import platform
import sys
import time

import numpy as np

from stalwart.sim import SimConfig, simulate
from stalwart.sim.alloc import keep_freed_memory


def timed(**kw: object) -> tuple[float, float, int, int]:
    """Best of 3: seconds, mean ETTR, passes, cycles per trial drawn."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        r = simulate(SimConfig(**kw))  # type: ignore[arg-type]
        best = min(best, time.perf_counter() - t0)
    mean_failures = float(np.mean(r.interruptions + r.planned))
    return best, float(r.ettr.mean()), r.iterations, int(mean_failures)


def main() -> None:
    quick = "--quick" in sys.argv
    tuned = "--library" not in sys.argv and keep_freed_memory()
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"python {platform.python_version()}, numpy {np.__version__}, "
        f"threads {len(os.sched_getaffinity(0))}, freed memory kept: {tuned}"
    )
    base_s, base_ettr, _, base_n = timed(gpus=16384, days=54, trials=1000)
    print(
        f"baseline 16,384 GPUs x 54 d x 1,000 trials: {base_s:.3f} s (ETTR {base_ettr:.3f}, {base_n} failures)"
    )
    year = dict(gpus=100000, days=365, trials=1000)
    rows = [
        ("100k x 1 year, pool (no spare limit)", 100000, *timed(**year)),
        ("100k x 1 year, 64 spares, elastic", 64, *timed(**year, spare_nodes=64, elastic=True)),
        ("100k x 1 year, 256 spares, elastic", 256, *timed(**year, spare_nodes=256, elastic=True)),
        ("100k x 1 year, 256 spares, waits", 256, *timed(**year, spare_nodes=256)),
        ("100k x 1 year, 64 spares, waits", 64, *timed(**year, spare_nodes=64)),
    ]
    if not quick:
        for gpus in (4096, 16384, 65536, 100000):
            rows.append(("gpus (54 d, 1,000 trials)", gpus, *timed(gpus=gpus, days=54, trials=1000)))
        for days in (14, 54, 108, 365):
            rows.append(("days (16,384 GPUs)", days, *timed(gpus=16384, days=days, trials=1000)))
        for trials in (100, 1000, 10000):
            rows.append(("trials (16,384 GPUs, 54 d)", trials, *timed(gpus=16384, days=54, trials=trials)))
        for spares in (0, 16, 64, 256):
            rows.append(
                ("spares, waits (16,384 GPUs, 54 d)", spares, *timed(gpus=16384, days=54, spare_nodes=spares))
            )
    print(
        f"{'case':38s} {'value':>7s} {'seconds':>8s} {'x base':>7s} {'ETTR':>6s} {'pass':>4s} {'fails':>7s}"
    )
    for what, value, s, e, passes, n in rows:
        print(f"{what:38s} {value:>7} {s:8.3f} {s / base_s:7.2f} {e:6.3f} {passes:4d} {n:7d}")


if __name__ == "__main__":
    main()
