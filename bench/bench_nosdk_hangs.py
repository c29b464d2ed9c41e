"""Hang detection for scripts without the SDK (CPU progress): false hangs over healthy runs and
detection latency after a SIGSTOP, idle machine and under a CPU hog.

Healthy runs: tests/e2e/user_scripts/epoch_trainer.py (2 ranks, gloo, no SDK) with rank 0
evaluating ``--eval-seconds`` per epoch while rank 1 waits in a barrier, under a CPU-stall
timeout shorter than that wait: every FailureDetected is a false hang.
SIGSTOP runs: the same job, rank 1 stopped after the first epoch; latency = detection - SIGSTOP.
Baseline: the configured ``--cpu-stall`` timeout of the same runs (latency / timeout shows the
detection overhead). torchrun has no hang detection: the same SIGSTOP lasts until the process-group
timeout (30 min by default in torch, 600 s under Stalwart); it is not re-measured here.

Run: .venv/bin/python bench/bench_nosdk_hangs.py [--healthy 20] [--stops 5] [--hog 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stalwart.events import FailureDetected
from stalwart.ledger import read_merged

SCRIPT = str(Path(__file__).parent.parent / "tests" / "e2e" / "user_scripts" / "epoch_trainer.py")
STALWART = [sys.executable, "-m", "stalwart.cli", "run", "-q", "--no-health-gate", "--nproc-per-node", "2"]


def _failures(run: Path) -> list[FailureDetected]:
    return [e for e in read_merged(run) if isinstance(e, FailureDetected)]


def healthy(n: int, stall: float, eval_s: float) -> dict:
    false = 0
    for _ in range(n):
        with tempfile.TemporaryDirectory() as d:
            run = Path(d) / "run"
            subprocess.run(
                [
                    *STALWART,
                    "--run-dir",
                    str(run),
                    "--cpu-stall",
                    str(stall),
                    "--max-restarts",
                    "0",
                    SCRIPT,
                    "--epochs",
                    "2",
                    "--eval-seconds",
                    str(eval_s),
                ],
                cwd=d,
                capture_output=True,
                timeout=600,
            )
            false += len(_failures(run))
    return {"runs": n, "false_hangs": false, "cpu_stall_s": stall, "eval_wait_s": eval_s}


def _pid_of(run_dir: Path, rank: int, env_key: str, deadline: float) -> int:
    while time.time() < deadline:
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                env = dict(kv.split("=", 1) for kv in (proc / "environ").read_text().split("\0") if "=" in kv)
            except OSError:
                continue
            if env.get(env_key) == str(run_dir) and env.get("RANK") == str(rank):
                return int(proc.name)
        time.sleep(0.1)
    raise RuntimeError("worker not found")


def sigstop_stalwart(stall: float) -> float:
    with tempfile.TemporaryDirectory() as d:
        run = Path(d) / "run"
        p = subprocess.Popen(
            [
                *STALWART,
                "--run-dir",
                str(run),
                "--node-name",
                "n0",
                "--cpu-stall",
                str(stall),
                "--max-restarts",
                "0",
                SCRIPT,
                "--epochs",
                "100000",
            ],
            cwd=d,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        log = run / "logs" / "n0-a0-r0.log"
        deadline = time.time() + 120
        while time.time() < deadline and not (log.exists() and "epoch 0 loss" in log.read_text()):
            time.sleep(0.1)
        pid = _pid_of(run, 1, "STALWART_W_RUN_DIR", deadline)
        t0 = time.time()
        os.kill(pid, signal.SIGSTOP)
        p.wait(timeout=600)
        hang = [f for f in _failures(run) if f.failure == "hang"]
        return hang[0].ts - t0 if hang else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--healthy", type=int, default=20)
    ap.add_argument("--stops", type=int, default=5)
    ap.add_argument("--stall", type=float, default=3.0)
    ap.add_argument("--eval", type=float, default=5.0)
    ap.add_argument("--hog", type=int, default=2, help="CPU hog processes for the loaded half")
    ap.add_argument("--json")
    args = ap.parse_args()
    out: dict = {"machine": os.uname().nodename, "cpus": os.cpu_count()}
    for label, hog in (("idle", 0), ("hog", args.hog)):
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hog)]
        try:
            out[label] = healthy(args.healthy, args.stall, args.eval)
            lat = [sigstop_stalwart(args.stall) for _ in range(args.stops)]
            out[label]["sigstop_latency_s"] = {
                "median": statistics.median(lat),
                "max": max(lat),
                "n": len(lat),
            }
        finally:
            for h in hogs:
                h.kill()
                h.wait()
        print(label, json.dumps(out[label]), flush=True)
    for label in ("idle", "hog"):
        out[label]["latency_over_timeout"] = out[label]["sigstop_latency_s"]["median"] / args.stall
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
