"""Soak benchmark: randomized fault plans over real runs of the example, each checked against a clean run.

    .venv/bin/python bench/soak.py --runs 100 --workdir /tmp/soak --json docs/soak.json

Prints one line per run and the summary (faults by kind, bit-identical ends, wrong resumes,
versions lost, false verdicts, tool hangs). Full-disk faults mount a real tmpfs and need root.
A short form of this runs in the test suite (tests/e2e/test_soak.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from stalwart.chaos.soak import Soak, SoakConfig


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--every", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-faults", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/stalwart-soak"))
    ap.add_argument("--json", type=Path, default=None, help="write the summary here")
    args = ap.parse_args()
    cfg = SoakConfig(
        workdir=args.workdir,
        runs=args.runs,
        nproc=args.nproc,
        steps=args.steps,
        every=args.every,
        seed=args.seed,
        faults_per_run=(1, args.max_faults),
    )
    t0 = time.time()

    def progress(partial) -> None:  # the figures so far, so a soak cut short still has them
        if args.json:
            data = json.loads(partial.to_json())
            data.update(wall_s=round(time.time() - t0), loadavg=os.getloadavg(), cpus=os.cpu_count())
            args.json.write_text(json.dumps(data, indent=1, sort_keys=True))

    summary = Soak(cfg).run_all(progress)
    print(summary.to_json())
    print(
        f"{summary.runs} runs, {summary.total_faults} faults of {len(summary.faults)} kinds in "
        f"{time.time() - t0:.0f}s; clean={summary.clean}"
    )
    progress(summary)
    return 0 if summary.clean else 1


if __name__ == "__main__":
    sys.exit(main())
