"""In-place recovery against whole-group restart and torchrun, at several world sizes: how the cost of
one rank's crash grows with the job.

The same DDP job (stalwart.examples.charlm through bench/recovery_worker.py, a checkpoint every
EVERY steps) loses rank 1 to a SIGKILL at step CRASH_STEP, on 2, 4, 8 and 16 ranks, three ways:

* ``in-place``: the default; the script runs under Session.run, so only rank 1 is replaced and the
  survivors hand it the live state;
* ``warm``: ``--no-in-place``, the whole group restarts warm from the fork server and loads the
  newest checkpoint;
* ``torchrun --max-restarts 3``: the whole group restarts cold and loads the newest checkpoint.

For each: fault -> first productive step (rank 0's first step line after the replacement started),
steps lost (steps completed before the fault that had to be redone, beyond the interrupted one), and
for in-place the phases the ledger recorded (detect, abort, replace, wait, rendezvous, transfer) and
the bytes moved against the state size.

With ``--idiom loop`` the job is the plain loop idiom instead (charlm ``--idiom loop``: no
``Session.run``; ``--idiom own``: the same with the script's own loop, ``session.track``), measured two ways: ``stalwart`` (the default: the survivors' processes end with the
broken group, they leave their live state in node memory on the way out, and the whole group restarts
warm and takes it: train/left_state.py) and ``torchrun``. ``--idiom lightning`` runs the same model
as a Lightning job (bench/lightning_worker.py: the StalwartCallback, a StatefulDataLoader), measured
the same two ways (the survivors leave Lightning's checkpoint of the last completed step:
integrations/lightning_left.py); ``--idiom hf`` as a Hugging Face ``Trainer`` job (bench/hf_worker.py:
a GPT-2 of charlm's size; integrations/hf_left.py).

Run: .venv/bin/python bench/bench_inplace.py [--ranks 2,4,8,16] [--repeats 1] [--json out.json]
     [--idiom loop|own|lightning|hf --crash-step 35 --steps 45]
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

from stalwart.account.recovery import recoveries
from stalwart.events import ChaosInjected, FailureDetected, ReformedInPlace, TrainingResumed
from stalwart.ledger import read_merged

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from bench_recovery import _boots  # noqa: E402 - the shared boot records of bench/recovery_worker.py

STEPS, EVERY, CRASH_STEP = 40, 10, 27
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
WORKER = HERE / "recovery_worker.py"  # bench/<idiom>_worker.py with --idiom lightning or hf
STEP_LINE = re.compile(r"^(?:\[\w+\]:)?step (\d+)/\d+ .* t (\d+\.\d+)$")


def _boot_times(boots: Path) -> list[float]:
    return [b["start"] for b in _boots(boots)]


def _steps(lines: list[str]) -> list[tuple[int, float]]:
    out = []
    for ln in lines:
        m = STEP_LINE.match(ln.strip())
        if m:
            out.append((int(m.group(1)), float(m.group(2))))
    return out


def _after(steps: list[tuple[int, float]], fault: float, respawn: float) -> dict:
    """Fault -> first step completed after the replacement started; steps lost beyond the interrupted one."""
    before = [n for n, t in steps if t <= fault]
    done = max(before, default=0)  # steps completed before the fault
    first = next(((n, t) for n, t in steps if t > respawn), None)
    if first is None:
        raise RuntimeError("no step after the restart in rank 0's output")
    resumed_at = first[0] - 1  # the first step line after recovery reports step resumed_at + 1
    return {"first_step_s": first[1] - fault, "steps_lost": max(0, done - resumed_at)}


def run_stalwart(work: Path, ranks: int, in_place: bool) -> dict:
    run_dir, boots = work / "stalwart", work / "boots"
    boots.mkdir()
    env = dict(os.environ, BENCH_BOOT_DIR=str(boots))
    cmd = [sys.executable, "-m", "stalwart.cli", "run", "-q", "--nproc-per-node", str(ranks)]
    cmd += ["--run-dir", str(run_dir), "--chaos", f"crash@rank=1,step={CRASH_STEP}"]
    cmd += [] if in_place else ["--no-in-place"]
    cmd += [str(WORKER), *JOB]
    t0 = time.time()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.time() - t0
    if p.returncode != 0:
        raise RuntimeError(f"stalwart run failed: {p.stdout[-3000:]}{p.stderr[-3000:]}")
    evs = read_merged(run_dir)
    fault = next(e for e in evs if isinstance(e, ChaosInjected) and e.fault.startswith("crash")).ts
    detected = next(e for e in evs if isinstance(e, FailureDetected))
    respawn = min(t for t in _boot_times(boots) if t > fault)
    log = sorted((run_dir / "logs").glob("*-r0.log"))
    lines = [ln for f in log for ln in f.read_text().splitlines()]
    row = {"wall_s": wall, "detect_s": detected.ts - fault, **_after(_steps(lines), fault, respawn)}
    rec = recoveries(evs)[0]
    row["path"], row["phases"] = rec.path, rec.phases
    reformed = [e for e in evs if isinstance(e, ReformedInPlace)]
    if reformed:
        r = reformed[0]
        row.update(in_place_phases=r.phases, bytes_moved=r.bytes_moved, state_bytes=r.state_bytes)
        row["steps_lost"] = r.lost_steps
    else:
        resumed = [e for e in evs if isinstance(e, TrainingResumed) and e.ts > fault]
        row["resumed_at"] = min((e.step for e in resumed), default=-1)
        row["source"] = next((e.from_checkpoint for e in resumed if e.rank == 0), "")
    return row


def run_torchrun(work: Path, ranks: int) -> dict:
    run_dir, boots = work / "torchrun", work / "boots"
    boots.mkdir()
    from stalwart.chaos.plan import build_plan

    env = dict(
        os.environ,
        BENCH_BOOT_DIR=str(boots),
        STALWART_W_RUN_DIR=str(run_dir),
        STALWART_W_CHAOS=build_plan([f"crash@rank=1,step={CRASH_STEP}"]).to_json(),
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",  # without it torchrun's restart hangs (torch >= 2.5)
        OMP_NUM_THREADS="1",
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)]
    # one restart is needed; the spares keep a restart that itself fails (seen once at 8 ranks) from
    # ending the run: each counts in the time to the first step after the fault
    cmd += ["--max-restarts", "3", "--monitor-interval", "0.1", str(WORKER), *JOB]
    t0 = time.time()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    wall = time.time() - t0
    if p.returncode != 0:
        raise RuntimeError(f"torchrun failed: {p.stdout[-2000:]}{p.stderr[-2000:]}")
    fault = next(e for e in read_merged(run_dir) if isinstance(e, ChaosInjected)).ts
    respawn = min(t for t in _boot_times(boots) if t > fault)
    return {"wall_s": wall, **_after(_steps(p.stdout.splitlines()), fault, respawn)}


def main() -> None:
    global CRASH_STEP, WORKER
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="2,4,8,16")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--skip-torchrun", action="store_true")
    ap.add_argument("--idiom", choices=("run", "loop", "own", "lightning", "hf"), default="run")
    ap.add_argument("--crash-step", type=int, default=CRASH_STEP)
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    CRASH_STEP = args.crash_step
    JOB[1] = str(args.steps)
    sizes = [int(x) for x in args.ranks.split(",")]
    res: dict = {"cpus": os.cpu_count(), "load_before": os.getloadavg(), "sizes": {}, "idiom": args.idiom}
    variants = [
        ("in-place", lambda w, n: run_stalwart(w, n, True)),
        ("warm", lambda w, n: run_stalwart(w, n, False)),
    ]
    if args.idiom in ("loop", "own", "lightning", "hf"):
        if args.idiom in ("loop", "own"):
            JOB.extend(["--idiom", args.idiom])
        else:
            WORKER = HERE / f"{args.idiom}_worker.py"
        variants = [("stalwart", lambda w, n: run_stalwart(w, n, True))]
    if not args.skip_torchrun:
        variants.append(("torchrun", run_torchrun))
    for n in sizes:
        rows: dict[str, list[dict]] = {name: [] for name, _ in variants}
        for i in range(args.repeats):
            for name, fn in variants:
                work = Path(tempfile.mkdtemp(prefix=f"bench-inplace-{n}-"))
                try:
                    rows[name].append(fn(work, n))
                finally:
                    shutil.rmtree(work, ignore_errors=True)
                r = rows[name][-1]
                print(
                    f"{n} ranks, round {i + 1}, {name}: fault -> first step {r['first_step_s']:.2f}s, "
                    f"steps lost {r['steps_lost']}"
                    + (f", phases {r['in_place_phases']}" if "in_place_phases" in r else ""),
                    flush=True,
                )
        res["sizes"][n] = rows
    print(
        f"\nfault -> first productive step, median (load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs)"
    )
    ref = variants[0][0]
    names = "/".join(name for name, _ in variants)
    print(
        "ranks | " + " | ".join(name for name, _ in variants) + f" | torchrun / {ref} | steps lost ({names})"
    )
    base = None
    for n in sizes:
        rows = res["sizes"][n]
        med = {name: statistics.median(r["first_step_s"] for r in rows[name]) for name in rows}
        lost = "/".join(str(max(r["steps_lost"] for r in rows[name])) for name in rows)
        ratio = med["torchrun"] / med[ref] if "torchrun" in med else float("nan")
        base = base if base is not None else med[ref]
        print(
            f"{n:5d} | "
            + " | ".join(f"{med[name]:.2f}s" for name in rows)
            + f" | {ratio:.1f}x | {lost} | {ref} vs smallest {med[ref] / base:.2f}x"
        )
        ip = rows[ref][-1]
        if "phases" in ip:
            ph = ", ".join(f"{k} {v:.3f}s" for k, v in ip["phases"].items() if v is not None)
            print(
                f"      {ref} ({ip['path']}, resumed at {ip.get('resumed_at', '-')} from {ip.get('source', '-')!r}): {ph}"
            )
        if "in_place_phases" in ip:
            ph = ", ".join(f"{k} {v:.3f}s" for k, v in ip["in_place_phases"].items())
            print(
                f"      in-place phases: {ph}; moved {ip['bytes_moved']} B for a state of {ip['state_bytes']} B"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
