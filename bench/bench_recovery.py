"""Recovery after a worker crash, and hang detection: Stalwart against torchrun, same job, same run.

Both launchers run the same 4-rank DDP job (stalwart.examples.charlm via bench/recovery_worker.py)
with the same injected fault (rank 1 SIGKILLs itself at step CRASH_STEP). Every worker writes
when its process started; rank 0 prints a wall-clock stamp after every step. From those, for both:

* crash -> replacement workers spawned (torchrun has no detection event; the respawn bounds it),
* crash -> first productive step after the restart (the first step completed by the new workers).

Stalwart also records its own detection time (FailureDetected) and, for the hang case, the hang
detection latency; torchrun only notices a hang when the process-group timeout fires (default
30 min), so its latency is the PG timeout, measured here with a short one.

Run: .venv/bin/python bench/bench_recovery.py [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stalwart.events import ChaosInjected, FailureDetected
from stalwart.ledger import read_merged

HERE = Path(__file__).parent
STEPS, EVERY, CRASH_STEP = 30, 5, 17
JOB = [
    "--steps",
    str(STEPS),
    "--checkpoint-every",
    str(EVERY),
    "--corpus-bytes",
    "300000",
    "--log-every",
    "1",
]
STEP_LINE = re.compile(r"^step (\d+)/\d+ .* t (\d+\.\d+)$")


def _boots(boot_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in boot_dir.glob("boot-*.json")]


def _first_step_after(lines: list[str], t: float) -> float:
    for line in lines:
        m = STEP_LINE.match(line.strip())
        if m and float(m.group(2)) > t:
            return float(m.group(2))
    raise RuntimeError("no step completed after the restart")


def _fault(run_dir: Path, kind: str) -> ChaosInjected:
    return next(e for e in read_merged(run_dir) if isinstance(e, ChaosInjected) and e.fault == kind)


def run_stalwart(work: Path, chaos: str, extra: list[str] = ()) -> dict:
    run_dir, boots = work / "stalwart", work / "boots-s"
    boots.mkdir()
    env = dict(os.environ, BENCH_BOOT_DIR=str(boots))
    t0 = time.time()
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "stalwart.cli",
            "run",
            "-q",
            "--nproc-per-node",
            "4",
            "--run-dir",
            str(run_dir),
            "--chaos",
            chaos,
            *extra,
            str(HERE / "recovery_worker.py"),
            *JOB,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    wall = time.time() - t0
    if p.returncode != 0:
        raise RuntimeError(f"stalwart run failed: {p.stdout}{p.stderr}")
    kind = chaos.split("@")[0]
    fault = _fault(run_dir, kind)
    detected = next(e for e in read_merged(run_dir) if isinstance(e, FailureDetected))
    respawn = min(b["start"] for b in _boots(boots) if b["start"] > fault.ts)
    lines = [ln for f in sorted((run_dir / "logs").glob("*-r0.log")) for ln in f.read_text().splitlines()]
    return {
        "detect_s": detected.ts - fault.ts,
        "respawn_s": respawn - fault.ts,
        "first_step_s": _first_step_after(lines, respawn) - fault.ts,
        "wall_s": wall,
    }


def run_torchrun(work: Path, chaos: str, pg_timeout_s: float | None = None) -> dict:
    run_dir, boots = work / "torchrun", work / "boots-t"
    boots.mkdir()
    env = dict(
        os.environ,
        BENCH_BOOT_DIR=str(boots),
        STALWART_RUN_DIR=str(run_dir),
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",  # without it torchrun's restart hangs (torch >= 2.5)
        OMP_NUM_THREADS="1",
    )
    from stalwart.chaos.plan import build_plan

    env["STALWART_CHAOS"] = build_plan([chaos]).to_json()
    if pg_timeout_s is not None:
        env["STALWART_PG_TIMEOUT_S"] = str(pg_timeout_s)
    t0 = time.time()
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "4",
            "--max-restarts",
            "1",
            "--monitor-interval",
            "0.1",
            str(HERE / "recovery_worker.py"),
            *JOB,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    wall = time.time() - t0
    if p.returncode != 0:
        raise RuntimeError(f"torchrun failed: {p.stdout[-2000:]}{p.stderr[-2000:]}")
    fault = _fault(run_dir, chaos.split("@")[0])
    respawn = min(b["start"] for b in _boots(boots) if b["start"] > fault.ts)
    return {
        "respawn_s": respawn - fault.ts,
        "first_step_s": _first_step_after(p.stdout.splitlines(), respawn) - fault.ts,
        "wall_s": wall,
    }


def median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--hang-pg-timeout",
        type=float,
        default=60.0,
        help="process-group timeout for the torchrun hang baseline (default PG timeout is 1800 s)",
    )
    ap.add_argument("--json", type=str, default="")
    args = ap.parse_args()
    crash = f"crash@rank=1,step={CRASH_STEP}"
    ours, theirs = [], []
    for i in range(args.repeats):
        for name, fn, out in (("stalwart", run_stalwart, ours), ("torchrun", run_torchrun, theirs)):
            work = Path(tempfile.mkdtemp(prefix=f"bench-recovery-{name}-"))
            try:
                out.append(fn(work, crash))
                print(
                    f"round {i + 1} {name}: " + ", ".join(f"{k} {v:.2f}s" for k, v in out[-1].items()),
                    flush=True,
                )
            finally:
                shutil.rmtree(work, ignore_errors=True)
    hang = f"hang@rank=1,step={CRASH_STEP}"
    work = Path(tempfile.mkdtemp(prefix="bench-hang-"))
    try:
        ours_hang = run_stalwart(work, hang, ["--hang-floor", "10"])
        theirs_hang = run_torchrun(Path(tempfile.mkdtemp(prefix="bench-hang-t-")), hang, args.hang_pg_timeout)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    res = {
        "crash": {"stalwart": ours, "torchrun": theirs},
        "hang": {
            "stalwart": ours_hang,
            "torchrun": theirs_hang,
            "torchrun_pg_timeout_s": args.hang_pg_timeout,
        },
    }
    print(f"\ncrash of 1 of 4 ranks (median of {args.repeats})")
    print(
        f"  stalwart: detect {median(ours, 'detect_s'):.2f}s, respawn {median(ours, 'respawn_s'):.2f}s, "
        f"first productive step {median(ours, 'first_step_s'):.2f}s"
    )
    print(
        f"  torchrun: respawn {median(theirs, 'respawn_s'):.2f}s, first productive step "
        f"{median(theirs, 'first_step_s'):.2f}s"
    )
    print(
        f"  ratio torchrun/stalwart, fault -> first productive step: "
        f"{median(theirs, 'first_step_s') / median(ours, 'first_step_s'):.2f}x"
    )
    print("hang of 1 of 4 ranks")
    print(
        f"  stalwart: detected {ours_hang['detect_s']:.2f}s after onset (floor 10 s), first productive step "
        f"{ours_hang['first_step_s']:.2f}s after onset"
    )
    print(
        f"  torchrun with a {args.hang_pg_timeout:g}s PG timeout: respawn {theirs_hang['respawn_s']:.2f}s after onset "
        f"(with the default 1800 s timeout it would wait 30 min)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
