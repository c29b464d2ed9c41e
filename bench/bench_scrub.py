"""Background checkpoint verification's cost: the time to re-read one committed version against its
manifest (launch/checkpoint_scrub.py), at two checkpoint sizes and on both tiers the SDK writes
(memory: tmpfs, local: disk), against the time the engine took to persist that same version to that
tier (the baseline, measured in the same run), and how often the default budget lets the agent read
it again (at most ``DEFAULT_DUTY`` of one CPU, and no sooner than ``DEFAULT_RECHECK_S``).

    .venv/bin/python bench/bench_scrub.py [--mib 2 256] [--repeat 3]

A version is read right after it was written, so its files are in the page cache: the figures are
hashing and copying, not the disk itself (a cold read adds the disk's read time).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path


def state_of(mib: int) -> dict:
    import torch  # deferred: heavy, and only once the arguments parsed

    n = (mib << 20) // 4 // 2  # float32, half model, half optimizer
    return {"model": {"w": torch.randn(n)}, "optim": {"m": torch.randn(n)}}


def best_reading(path: Path, repeat: int) -> tuple[float, float]:
    """(best wall s, its thread CPU s) of reading the version against its manifest."""
    from stalwart.checkpoint.scrub import read_version  # deferred: as above

    runs = []
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.thread_time()
        got = read_version(path, None, settle=lambda: None)
        runs.append((time.perf_counter() - w0, time.thread_time() - c0))
        assert got.reading.problem == "", got.reading.problem
    return min(runs)


def measure(mib: int, root: Path, repeat: int) -> list[tuple[str, float, float, float]]:
    from stalwart.checkpoint.engine import CheckpointEngine  # deferred: heavy (torch)
    from stalwart.checkpoint.tiers import TierConfig  # deferred: as above

    tiers = [
        TierConfig(name="memory", kind="memory", location=str(Path("/dev/shm") / root.name / "m")),
        TierConfig(name="local", kind="local", location=str(root / "disk")),
    ]
    eng = CheckpointEngine(tiers)
    res = eng.save(1, state_of(mib)).future.result()
    eng.close()
    out = []
    for c in res.commits:
        wall, cpu = best_reading(Path(c.path), repeat)
        out.append((c.tier, c.persist_s, wall, cpu))
    return out


def main() -> None:
    from stalwart.policy.checkpoint_scrub import DEFAULT_DUTY, DEFAULT_RECHECK_S  # deferred: as above

    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, nargs="+", default=[2, 256])
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    print(f"default budget: {DEFAULT_DUTY:.0%} of one CPU, each version again after {DEFAULT_RECHECK_S:g} s")
    print(
        f"{'size':>8} {'tier':7} {'persist (base)':>14} {'verify':>8} {'ratio':>6} {'GB/s':>6} {'CPU':>7} {'one version re-read every':>26}"
    )
    for mib in a.mib:
        with tempfile.TemporaryDirectory(dir=".") as d:
            root = Path(d)
            try:
                for tier, persist, wall, cpu in measure(mib, root, a.repeat):
                    every = max(cpu / DEFAULT_DUTY, DEFAULT_RECHECK_S)  # the budget is CPU time
                    print(
                        f"{mib:>5} MiB {tier:7} {persist:>12.3f} s {wall:>6.3f} s {wall / persist:>5.2f}x "
                        f"{(mib << 20) / wall / 1e9:>6.2f} {cpu:>5.3f} s {every:>24.1f} s"
                    )
            finally:
                shutil.rmtree(Path("/dev/shm") / root.name, ignore_errors=True)


if __name__ == "__main__":
    main()
