"""Hangs without the SDK (issue 25): false hang decisions on a healthy low-CPU job, hang detection
latency after a SIGSTOP, and the per-step cost of the bootstrap's optimizer step hooks.

Job: tests/e2e/user_scripts/lowcpu_trainer.py (2 ranks, gloo, no Stalwart import): each step a rank
waits ``--idle`` s, then one small all-reduce and an SGD step.

* healthy: rank 1 also waits ``--io-wait`` s on "I/O" at step 1 (longer than the old 30 s default
  CPU-stall timeout). Three configurations of the same job in the same run: the old default
  (``--no-instrument --cpu-stall 30``: idleness counted as a hang, the baseline), the new default
  without hooks (``--no-instrument``: idleness waits for the process-group timeout) and the new
  default with hooks (steps observed). Every FailureDetected is a false hang.
* SIGSTOP of rank 1 after 20 steps: latency = the hang's FailureDetected - the SIGSTOP, with hooks
  (the step timeout, at the hang floor ``--floor``) and without (``--no-instrument``: a stopped
  process after the floor). Baseline: the old default (30 s) and torchrun (none: the process-group
  timeout, 600 s under Stalwart, 30 min in torch), not re-run.
* overhead: one process, one torch thread, a tiny model's SGD step plus 64x64 matmuls sized to
  1 ms and 16 ms; median step time with the hooks registered against the same loop without them,
  alternating rounds, and the observer's own cost per step (the kept gradient hook's call, pre and
  post: a record encoded and written to a real pipe drained by ``cat``).

Run: .venv/bin/python bench/bench_nosdk_hangs.py [--healthy 3] [--stops 3] [--json out.json]
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

from stalwart.events import FailureDetected, WorkersStarted
from stalwart.ledger import read_merged

SCRIPT = str(Path(__file__).parent.parent / "tests" / "e2e" / "user_scripts" / "lowcpu_trainer.py")
STALWART = [sys.executable, "-m", "stalwart.cli", "run", "-q", "--no-health-gate", "--nproc-per-node", "2"]
CONFIGS = {
    "old default (no hooks, --cpu-stall 30)": ["--no-instrument", "--cpu-stall", "30"],
    "new default, no hooks": ["--no-instrument"],
    "new default, hooks": [],
}


def _events(run: Path, kind: type) -> list:
    try:
        return [e for e in read_merged(run) if isinstance(e, kind)]
    except Exception:  # noqa: BLE001 - a ledger still being created
        return []


def healthy(n: int, io_wait: float) -> dict:
    out = {}
    for label, extra in CONFIGS.items():
        false = 0
        for _ in range(n):
            with tempfile.TemporaryDirectory() as d:
                run = Path(d) / "run"
                cmd = [*STALWART, "--run-dir", str(run), "--max-restarts", "0", *extra, SCRIPT]
                cmd += ["--steps", "4", "--idle", "0.5", "--io-rank", "1", "--io-wait", str(io_wait)]
                subprocess.run(cmd, cwd=d, capture_output=True, timeout=900)
                false += len(_events(run, FailureDetected))
        out[label] = {"runs": n, "false_hangs": false}
        print("healthy", label, out[label], flush=True)
    return out


def sigstop(extra: list[str], floor: float) -> float:
    with tempfile.TemporaryDirectory() as d:
        run = Path(d) / "run"
        cmd = [*STALWART, "--run-dir", str(run), "--max-restarts", "0", "--hang-floor", str(floor)]
        cmd += [*extra, SCRIPT, "--steps", "100000", "--idle", "0.1"]
        p = subprocess.Popen(cmd, cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.time() + 180
            while time.time() < deadline:
                log = run / "logs"
                text = (
                    "".join(f.read_text(errors="replace") for f in log.glob("*-r1.log"))
                    if log.exists()
                    else ""
                )
                if "rank 1 step 20" in text:
                    break
                time.sleep(0.2)
            started = _events(run, WorkersStarted)[-1]
            pid = dict(zip(started.global_ranks, started.pids, strict=True))[1]
            t0 = time.time()
            os.kill(pid, signal.SIGSTOP)
            p.wait(timeout=900)
        finally:
            if p.poll() is None:
                p.kill()
        hang = [f for f in _events(run, FailureDetected) if f.failure == "hang"]
        return hang[0].ts - t0 if hang else float("nan")


def overhead(step_ms: float, rounds: int, steps: int) -> dict:
    """Per-step cost of the hooks: the observer's own pre+post calls (a record encoded and written
    to a real pipe), and whole steps of fixed work (a tiny SGD step plus matmuls sized to
    ``step_ms``) with and without the hooks registered, alternating rounds, median step time."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    from stalwart.launch.processes.bootstrap import StepObserver
    from stalwart.protocol.pipe import Sender

    torch.set_num_threads(1)
    sink = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    assert sink.stdin is not None
    sender = Sender(os.dup(sink.stdin.fileno()))
    obs = StepObserver(0, sender)
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, a = torch.randn(8, 16), torch.randn(64, 64)

    def work(k: int) -> None:
        for _ in range(k):
            torch.mm(a, a)

    t0 = time.perf_counter()
    work(200)
    per = (time.perf_counter() - t0) / 200
    k = max(1, int(step_ms / 1e3 / per))

    def loop() -> float:
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            opt.zero_grad()
            model(x).sum().backward()
            work(k)
            opt.step()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    def direct(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            obs.grad_ready(0)  # the kept gradient hook's call (the others are gone after 3 steps)
            obs.pre(opt, (), {})
            obs.post(opt, (), {})
        return (time.perf_counter() - t0) / n

    loop()  # warm up (the first step imports torch's lazy modules)
    bare, hooked = [], []
    for _ in range(rounds):
        bare.append(loop())
        fresh = StepObserver(0, sender)  # its gradient hooks come with its first step, go with the round
        handles = [register_optimizer_step_pre_hook(fresh.pre), register_optimizer_step_post_hook(fresh.post)]
        hooked.append(loop())
        for h in [*handles, *fresh.grad_hooks.values()]:
            h.remove()
    direct_us = statistics.median(direct(2000) for _ in range(rounds)) * 1e6
    for h in obs.grad_hooks.values():
        h.remove()
    sender.close()
    sink.stdin.close()
    sink.wait(timeout=60)
    b, h = statistics.median(bare), statistics.median(hooked)
    return {
        "step_ms_target": step_ms,
        "bare_ms": b * 1e3,
        "hooked_ms": h * 1e3,
        "overhead_pct": 100 * (h - b) / b,
        "observer_us_per_step": direct_us,
        "observer_pct_of_step": 100 * direct_us / (b * 1e6),
        "dropped": sender.dropped,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--healthy", type=int, default=3)
    ap.add_argument("--io-wait", type=float, default=35.0)
    ap.add_argument("--stops", type=int, default=3)
    ap.add_argument("--floors", default="10,2", help="hang floors for the SIGSTOP runs")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: healthy,sigstop,overhead")
    ap.add_argument("--json")
    args = ap.parse_args()
    skip = set(args.skip.split(","))
    out: dict = {"machine": os.uname().nodename, "cpus": os.cpu_count(), "load": os.getloadavg()}
    if "overhead" not in skip:
        out["overhead"] = [overhead(ms, args.rounds, int(2000 / ms) + 50) for ms in (1.0, 16.0)]
        print("overhead", json.dumps(out["overhead"]), flush=True)
    if "sigstop" not in skip:
        lat: dict = {}
        for floor in (float(f) for f in args.floors.split(",")):
            for label, extra in (("hooks", []), ("no hooks", ["--no-instrument"])):
                got = [sigstop(extra, floor) for _ in range(args.stops)]
                lat[f"{label}, floor {floor:g}s"] = {
                    "median": statistics.median(got),
                    "max": max(got),
                    "n": len(got),
                }
                print("sigstop", label, floor, got, flush=True)
        out["sigstop_latency_s"] = lat
    if "healthy" not in skip:
        out["healthy"] = healthy(args.healthy, args.io_wait)
    out["load_after"] = os.getloadavg()
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
