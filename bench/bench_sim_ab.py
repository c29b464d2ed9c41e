"""The simulator's 100k-GPU-year rows, this tree against an earlier commit, side by side in one run.

On a busy machine two runs an hour apart are not comparable, so both engines are timed here in
turns: each repeat runs every case once with the baseline's source (``git archive`` of ``--base``
into a temporary directory) and once with this tree's, each in a fresh process that keeps freed memory
(as the commands do) and reports the best of ``--inner`` calls. Printed per case and engine: min and
median over the repeats, the mean ETTR (it must be the same for both), and the load average.

    .venv/bin/python bench/bench_sim_ab.py --base 43a26bf --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
YEAR = dict(gpus=100000, days=365, trials=1000)
CASES: dict[str, dict[str, object]] = {
    "baseline 16,384 GPUs x 54 d": dict(gpus=16384, days=54, trials=1000),
    "100k x 1 year, pool": YEAR,
    "100k x 1 year, 64 spares, elastic": {**YEAR, "spare_nodes": 64, "elastic": True},
    "100k x 1 year, 256 spares, elastic": {**YEAR, "spare_nodes": 256, "elastic": True},
    "100k x 1 year, 256 spares, waits": {**YEAR, "spare_nodes": 256},
    "100k x 1 year, 64 spares, waits": {**YEAR, "spare_nodes": 64},
}

CHILD = """
import json, sys, time
from stalwart.sim import SimConfig, simulate
from stalwart.sim.alloc import keep_freed_memory
keep_freed_memory()
kw, inner = json.loads(sys.argv[1]), int(sys.argv[2])
best = float("inf")
for _ in range(inner):
    t0 = time.perf_counter()
    r = simulate(SimConfig(**kw))
    best = min(best, time.perf_counter() - t0)
print(json.dumps([best, float(r.ettr.mean())]))
"""


def timed(src: Path, kw: dict[str, object], inner: int) -> tuple[float, float]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(kw), str(inner)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    best, ettr = json.loads(out)
    return float(best), float(ettr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="git revision of the baseline engine")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--inner", type=int, default=2, help="calls per process; the best one counts")
    ap.add_argument("--only", default="", help="run only the cases whose name contains this")
    args = ap.parse_args()
    cases = {k: v for k, v in CASES.items() if args.only in k}
    with tempfile.TemporaryDirectory(prefix="plan-bench-ab-") as tmp:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", args.base, "src"], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        trees = {"base": Path(tmp) / "src", "this": ROOT / "src"}
        times: dict[tuple[str, str], list[float]] = {}
        ettr: dict[tuple[str, str], float] = {}
        loads = [os.getloadavg()[0]]
        for _ in range(args.repeats):
            for name, kw in cases.items():
                for tree, src in trees.items():
                    s, e = timed(src, kw, args.inner)
                    times.setdefault((name, tree), []).append(s)
                    ettr[(name, tree)] = e
            loads.append(os.getloadavg()[0])
    print(f"base {args.base}; {args.repeats} repeats x best of {args.inner}; {os.cpu_count()} CPUs")
    print(f"load average (1 min) over the run: {min(loads):.2f}-{max(loads):.2f}")
    print(f"{'case':38s} {'engine':6s} {'min s':>7s} {'median s':>9s} {'ETTR':>9s}")
    for name in cases:
        for tree in trees:
            t = times[(name, tree)]
            print(f"{name:38s} {tree:6s} {min(t):7.3f} {statistics.median(t):9.3f} {ettr[(name, tree)]:9.6f}")


if __name__ == "__main__":
    main()
