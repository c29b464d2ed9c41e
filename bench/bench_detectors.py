"""Precision and recall per detector over a labelled corpus of real ``stalwart run`` runs (issue 14).

    .venv/bin/python bench/bench_detectors.py [--fault-runs N] [--slow-runs N] [--healthy-runs N]
                                              [--near-runs N] [--stall-runs N]
                                              [--conditions idle,load] [--json FILE]

Every run is a real ``stalwart run`` of ``bench/detector_worker.py`` (2 ranks, gloo, timed sections,
a checkpoint every 5 steps), with the live diagnosis collector on (its default):

- a *fault run* injects five labelled faults, one per attempt: ``crash`` (SIGKILL) at step 6,
  ``exit`` (exit 1) at step 12, ``hang`` at step 18, ``raise`` at step 24 (a deterministic bug: it
  fires again in the retry, so two labelled faults); ranks alternate between runs;
- a *slow run* slows one rank 3x from step 3 (the straggler detector should catch it);
- a *healthy run* injects nothing: every firing there is false;
- harder cases: a *near run* slows one rank only ``--near-factor`` (1.6x: with two ranks the
  per-step median is their mean, so its score is about 1.23, just above the 1.2 threshold); a
  *stall run* pauses one rank once for ``--stall-s`` seconds (1.5 s, half the 3 s hang floor): a
  stall shorter than the hang timeout, which must NOT fire as a hang (its label expects silence, so
  it is kept out of the recall columns and reported on its own line).

``load`` runs the same corpus beside ``stress --cpu 2`` (a CPU hog on this 2-core machine).
Ground truth: the ``ChaosInjected`` events the workers write; ``slow`` writes none, so the bench
adds one label per slow run (rank, at the run's first attempt). The table is
:func:`stalwart.diagnose.precision.detector_stats` per run, summed: the same function the report's
precision table uses.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKER = str(ROOT / "bench" / "detector_worker.py")


def run_one(run_dir: Path, steps: int, chaos: list[str], extra: tuple[str, ...] = ()) -> tuple[int, float]:
    cmd = [
        sys.executable,
        "-m",
        "stalwart.cli",
        "run",
        "-q",
        "--no-health-gate",
        "--nproc-per-node",
        "2",
        "--node-name",
        "n0",
        "--max-restarts",
        "6",
        "--hang-floor",
        "3",
        "--backoff",
        "0",
        "--run-dir",
        str(run_dir),
    ]
    for c in chaos:
        cmd += ["--chaos", c]
    cmd += [WORKER, str(steps), *extra]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    return p.returncode, time.perf_counter() - t0


def corpus(
    fault_runs: int,
    slow_runs: int,
    healthy_runs: int,
    near_runs: int = 0,
    stall_runs: int = 0,
    near_factor: float = 1.6,
    stall_s: float = 1.5,
) -> list[tuple[str, list[str], int, tuple[str, ...]]]:
    """(name, chaos faults, steps, extra worker arguments) per run."""
    out = []
    for i in range(fault_runs):
        a, b = i % 2, 1 - i % 2
        plan = [f"crash@rank={a},step=6", f"exit@rank={b},step=12", f"hang@rank={a},step=18"]
        out.append((f"faults-{i}", [*plan, f"raise@rank={b},step=24"], 30, ()))
    for i in range(slow_runs):
        out.append((f"slow-{i}", [f"slow@rank={i % 2},factor=3,from=3"], 40, ()))
    for i in range(near_runs):
        out.append((f"near-{i}", [f"slow@rank={i % 2},factor={near_factor:g},from=3"], 40, ()))
    for i in range(stall_runs):
        out.append((f"stall-{i}", [], 40, (f"pause={i % 2}:20:{stall_s:g}",)))
    for i in range(healthy_runs):
        out.append((f"healthy-{i}", [], 40, ()))
    return out


def labelled_events(run_dir: Path, chaos: list[str]) -> list:
    from stalwart.events import AttemptStarted, ChaosInjected
    from stalwart.ledger import read_available

    evs = list(read_available(run_dir).events)
    first = min((e for e in evs if isinstance(e, AttemptStarted)), key=lambda e: e.ts, default=None)
    for c in chaos:
        if c.startswith("slow@") and first is not None:
            rank = int(c.split("rank=")[1].split(",")[0])
            evs.append(
                ChaosInjected(ts=first.ts, run_id=first.run_id, node="n0", attempt=0, rank=rank, fault="slow")
            )
    return evs


def stress_on():
    return subprocess.Popen(
        ["stress", "--cpu", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )


def stress_off(p) -> None:
    try:
        os.killpg(p.pid, signal.SIGTERM)  # stress and the workers it forked (its own process group)
    except ProcessLookupError:
        pass
    p.wait(timeout=10)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fault-runs", type=int, default=10)
    ap.add_argument("--slow-runs", type=int, default=5)
    ap.add_argument("--healthy-runs", type=int, default=10)
    ap.add_argument("--near-runs", type=int, default=0)
    ap.add_argument("--stall-runs", type=int, default=0)
    ap.add_argument("--near-factor", type=float, default=1.6)
    ap.add_argument("--stall-s", type=float, default=1.5)
    ap.add_argument("--conditions", default="idle,load")
    ap.add_argument("--json", default="")
    args = ap.parse_args()

    from stalwart.diagnose.precision import detector_stats
    from stalwart.events import FailureDetected, IncidentRaised, StragglerDetected

    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="bench-detectors-") as tmp:
        for cond in args.conditions.split(","):
            hog = stress_on() if cond == "load" else None
            try:
                sums: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
                healthy = {
                    "runs": 0,
                    "false_straggler": 0,
                    "false_hang": 0,
                    "false_failure": 0,
                    "incidents": 0,
                }
                near = {"runs": 0, "caught": 0}
                stall = {"runs": 0, "false_hang": 0, "false_failure": 0, "false_straggler": 0, "stalled": 0}
                walls, labelled, loads = [], 0, []
                runs = corpus(
                    args.fault_runs,
                    args.slow_runs,
                    args.healthy_runs,
                    args.near_runs,
                    args.stall_runs,
                    args.near_factor,
                    args.stall_s,
                )
                for name, chaos, steps, extra in runs:
                    rd = Path(tmp) / cond / name
                    code, wall = run_one(rd, steps, chaos, extra)
                    walls.append(wall)
                    loads.append(os.getloadavg()[0])  # the machine is shared: say how busy it was
                    evs = labelled_events(rd, chaos)
                    labelled += sum(1 for e in evs if e.kind == "ChaosInjected")
                    for s in detector_stats(evs):
                        row = sums[s.detector]
                        row[0] += s.firings
                        row[1] += s.confirmed
                        row[2] += s.faults
                        row[3] += s.caught
                    if name.startswith("near-"):
                        near["runs"] += 1
                        near["caught"] += sum(
                            s.caught for s in detector_stats(evs) if s.detector == "straggler"
                        )
                    if extra:  # a stall shorter than the hang timeout: any firing is false
                        stall["runs"] += 1
                        stall["false_hang"] += sum(
                            isinstance(e, FailureDetected) and e.failure == "hang" for e in evs
                        )
                        stall["false_failure"] += sum(isinstance(e, FailureDetected) for e in evs)
                        stall["false_straggler"] += sum(isinstance(e, StragglerDetected) for e in evs)
                        longest = max((e.duration for e in evs if e.kind == "StepCompleted"), default=0.0)
                        stall["stalled"] += longest >= args.stall_s  # the pause did happen
                    elif not chaos:
                        healthy["runs"] += 1
                        healthy["false_straggler"] += sum(isinstance(e, StragglerDetected) for e in evs)
                        healthy["false_hang"] += sum(
                            isinstance(e, FailureDetected) and e.failure == "hang" for e in evs
                        )
                        healthy["false_failure"] += sum(isinstance(e, FailureDetected) for e in evs)
                        healthy["incidents"] += sum(isinstance(e, IncidentRaised) for e in evs)
                        if code != 0:
                            print(f"  {cond}/{name}: healthy run exited {code}", flush=True)
                    print(f"  {cond}/{name}: exit {code}, {wall:.1f}s", flush=True)
            finally:
                if hog is not None:
                    stress_off(hog)
            results[cond] = {
                "runs": len(walls),
                "labelled_faults": labelled,
                "wall_s_total": round(sum(walls), 1),
                "loadavg_1m_median": round(sorted(loads)[len(loads) // 2], 1) if loads else None,
                "detectors": {
                    d: {"firings": v[0], "confirmed": v[1], "faults": v[2], "caught": v[3]}
                    for d, v in sorted(sums.items())
                },
                "healthy": healthy,
                "near_threshold": near,
                "short_stall": stall,
            }

    def pct(a: int, b: int) -> str:
        return f"{100 * a / b:.0f}%" if b else "n/a"

    for cond, r in results.items():
        print(
            f"\n### {cond}: {r['runs']} real runs, {r['labelled_faults']} labelled faults, "
            f"{r['wall_s_total']} s, 1-min load average (median at run ends) {r['loadavg_1m_median']}"
        )
        print("| detector | firings | confirmed | precision | faults | caught | recall |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for d, v in r["detectors"].items():
            print(
                f"| {d} | {v['firings']} | {v['confirmed']} | {pct(v['confirmed'], v['firings'])} | "
                f"{v['faults']} | {v['caught']} | {pct(v['caught'], v['faults'])} |"
            )
        h = r["healthy"]
        print(
            f"healthy runs: {h['runs']}; false stragglers {h['false_straggler']}, false hangs {h['false_hang']}, "
            f"any failure {h['false_failure']}, incidents {h['incidents']}"
        )
        n, st = r["near_threshold"], r["short_stall"]
        if n["runs"]:
            print(
                f"near-threshold slow runs ({args.near_factor:g}x): {n['runs']}; straggler caught {n['caught']}"
            )
        if st["runs"]:
            print(
                f"short stalls ({args.stall_s:g} s, below the 3 s hang floor): {st['runs']} "
                f"({st['stalled']} with a step that long); hang fired "
                f"{st['false_hang']}, any failure {st['false_failure']}, stragglers {st['false_straggler']}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
