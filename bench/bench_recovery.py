"""Recovery after a worker crash, and hang detection: Stalwart against torchrun, same job, same run.

Both launchers run the same 4-rank DDP job (stalwart.examples.charlm via bench/recovery_worker.py)
with the same injected fault (rank 1 SIGKILLs itself at step CRASH_STEP). Every worker writes
when its process started; rank 0 prints a wall-clock stamp after every step. From those, for both:

* crash -> replacement workers spawned (torchrun has no detection event; the respawn bounds it),
* crash -> first productive step after the restart (the first step completed by the new workers).

Stalwart runs three ways: warm (the default: workers forked from the agent's fork server), cold
fallback (the warm path forced to fail at the restart: STALWART_WARM_FAIL_ATTEMPT=1) and --no-warm
(every start cold, the previous behaviour). For each, the recovery's phases come from the ledger
(stalwart.account.recovery), and a sampler reads RSS/PSS of the fork server and of the workers.

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
import threading
import time
from pathlib import Path

from stalwart.account.recovery import recoveries
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


def _mem_kb(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of one process in KiB, from /proc/<pid>/smaps_rollup; (0, 0) if it is gone."""
    rss = pss = 0
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Rss:"):
                rss = int(line.split()[1])
            elif line.startswith("Pss:"):
                pss = int(line.split()[1])
    except OSError:
        pass
    return rss, pss


def _start_ticks(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 1 << 62


class MemorySampler(threading.Thread):
    """Every 0.5 s: the fork server's RSS/PSS and the summed RSS/PSS of the run's workers. Warm
    workers carry the server's command line (they are forks of it; /proc/<pid>/environ keeps the
    server's too), so among the processes with the server's command line the oldest is the server
    and the others are warm workers; cold workers have STALWART_W_RUN_DIR in their environment."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(daemon=True)
        self.run_dir, self.stop = str(run_dir), threading.Event()
        self.server = {"rss_kb": 0, "pss_kb": 0, "processes": 0}
        self.workers = {"rss_kb": 0, "pss_kb": 0, "processes": 0}

    def run(self) -> None:
        tag = f"STALWART_W_RUN_DIR={self.run_dir}".encode()
        while not self.stop.wait(0.5):
            servers, workers = [], []
            for entry in os.listdir("/proc"):
                if not entry.isdigit():
                    continue
                try:
                    cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
                    if b"stalwart-fork-server" in cmd and f"run_dir={self.run_dir}".encode() in cmd:
                        servers.append(int(entry))
                    elif tag in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                        workers.append(int(entry))
                except OSError:
                    continue
            servers.sort(key=_start_ticks)
            servers, workers = servers[:1], workers + servers[1:]
            for pids, acc in ((servers, self.server), (workers, self.workers)):
                mem = [_mem_kb(p) for p in pids]
                acc["rss_kb"] = max(acc["rss_kb"], sum(m[0] for m in mem))
                acc["pss_kb"] = max(acc["pss_kb"], sum(m[1] for m in mem))
                acc["processes"] = max(acc["processes"], len(pids))


def run_stalwart(work: Path, chaos: str, extra: list[str] = (), env_extra: dict | None = None) -> dict:
    run_dir, boots = work / "stalwart", work / "boots-s"
    boots.mkdir()
    env = dict(os.environ, BENCH_BOOT_DIR=str(boots), **(env_extra or {}))
    sampler = MemorySampler(run_dir)
    sampler.start()
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
    sampler.stop.set()
    sampler.join()
    if p.returncode != 0:
        raise RuntimeError(f"stalwart run failed: {p.stdout}{p.stderr}")
    kind = chaos.split("@")[0]
    fault = _fault(run_dir, kind)
    evs = read_merged(run_dir)
    detected = next(e for e in evs if isinstance(e, FailureDetected))
    respawn = min(b["start"] for b in _boots(boots) if b["start"] > fault.ts)
    lines = [ln for f in sorted((run_dir / "logs").glob("*-r0.log")) for ln in f.read_text().splitlines()]
    rec = recoveries(evs)[0]
    return {
        "detect_s": detected.ts - fault.ts,
        "respawn_s": respawn - fault.ts,
        "first_step_s": _first_step_after(lines, respawn) - fault.ts,
        "wall_s": wall,
        "path": rec.path,
        "phases": rec.phases,
        "server_mem": sampler.server,
        "workers_mem": sampler.workers,
    }


def run_torchrun(work: Path, chaos: str, pg_timeout_s: float | None = None) -> dict:
    run_dir, boots = work / "torchrun", work / "boots-t"
    boots.mkdir()
    env = dict(
        os.environ,
        BENCH_BOOT_DIR=str(boots),
        STALWART_W_RUN_DIR=str(run_dir),
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",  # without it torchrun's restart hangs (torch >= 2.5)
        OMP_NUM_THREADS="1",
    )
    from stalwart.chaos.plan import build_plan

    env["STALWART_W_CHAOS"] = build_plan([chaos]).to_json()
    if pg_timeout_s is not None:
        env["STALWART_W_PG_TIMEOUT_S"] = str(pg_timeout_s)
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
    ap.add_argument("--skip-hang", action="store_true", help="only the crash recovery (saves ~2 min)")
    args = ap.parse_args()
    crash = f"crash@rank=1,step={CRASH_STEP}"
    ours, fallback, cold, theirs = [], [], [], []
    variants = (
        ("stalwart warm", lambda w, c: run_stalwart(w, c), ours),
        ("stalwart cold fallback", lambda w, c: run_stalwart(w, c, env_extra={"STALWART_WARM_FAIL_ATTEMPT": "1"}), fallback),
        ("stalwart --no-warm", lambda w, c: run_stalwart(w, c, ["--no-warm"]), cold),
        ("torchrun", run_torchrun, theirs),
    )  # fmt: skip
    for i in range(args.repeats):
        for name, fn, out in variants:
            work = Path(tempfile.mkdtemp(prefix="bench-recovery-"))
            try:
                out.append(fn(work, crash))
                shown = {k: v for k, v in out[-1].items() if isinstance(v, float)}
                print(
                    f"round {i + 1} {name}: {out[-1].get('path', '')} "
                    + ", ".join(f"{k} {v:.2f}s" for k, v in shown.items()),
                    flush=True,
                )
            finally:
                shutil.rmtree(work, ignore_errors=True)
    hang = f"hang@rank=1,step={CRASH_STEP}"
    work = Path(tempfile.mkdtemp(prefix="bench-hang-"))
    ours_hang = theirs_hang = None
    try:
        if not args.skip_hang:
            ours_hang = run_stalwart(work, hang, ["--hang-floor", "10"])
            theirs_hang = run_torchrun(
                Path(tempfile.mkdtemp(prefix="bench-hang-t-")), hang, args.hang_pg_timeout
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    res = {
        "load_before": os.getloadavg(),
        "cpus": os.cpu_count(),
        "crash": {
            "stalwart": ours,
            "stalwart_cold_fallback": fallback,
            "stalwart_no_warm": cold,
            "torchrun": theirs,
        },
        "hang": {
            "stalwart": ours_hang,
            "torchrun": theirs_hang,
            "torchrun_pg_timeout_s": args.hang_pg_timeout,
        },
    }
    print(f"\ncrash of 1 of 4 ranks (median of {args.repeats}; load average {os.getloadavg()[0]:.1f})")
    for name, rows in (("stalwart warm", ours), ("cold fallback", fallback), ("--no-warm", cold)):
        phases = {k: statistics.median(r["phases"][k] or 0.0 for r in rows) for k in rows[0]["phases"]}
        print(
            f"  {name}: paths {[r['path'] for r in rows]}, detect {median(rows, 'detect_s'):.2f}s, respawn "
            f"{median(rows, 'respawn_s'):.2f}s, first productive step {median(rows, 'first_step_s'):.2f}s; "
            "phases " + ", ".join(f"{k} {v:.2f}s" for k, v in phases.items())
        )
        srv, wrk = rows[-1]["server_mem"], rows[-1]["workers_mem"]
        print(
            f"    fork server: {srv['processes']} process(es), peak RSS {srv['rss_kb'] / 1024:.0f} MiB, PSS "
            f"{srv['pss_kb'] / 1024:.0f} MiB; workers ({wrk['processes']}): peak RSS {wrk['rss_kb'] / 1024:.0f} "
            f"MiB, PSS {wrk['pss_kb'] / 1024:.0f} MiB"
        )
    print(
        f"  torchrun: respawn {median(theirs, 'respawn_s'):.2f}s, first productive step "
        f"{median(theirs, 'first_step_s'):.2f}s"
    )
    for name, rows in (("warm", ours), ("cold fallback", fallback), ("--no-warm", cold)):
        print(
            f"  ratio torchrun/stalwart {name}, fault -> first productive step: "
            f"{median(theirs, 'first_step_s') / median(rows, 'first_step_s'):.2f}x"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    if ours_hang is None or theirs_hang is None:
        return
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
