"""Health-check timings: full passive check, active suite, and failing check -> node drained in Slurm.

    .venv/bin/python bench/bench_health.py [--repeat N] [--no-slurm]

Every figure is printed with a ratio against a baseline measured in the same run:
- passive check (in process) vs reading the recorded snapshot alone;
- `stalwart health check` as a process vs a bare `python -c "import stalwart"`;
- failing check -> drained (CLI, sinfo read-back) vs a raw `scontrol update State=DRAIN` + `sinfo` read-back.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "gpu"
sys.path.insert(0, str(ROOT / "tests"))


def timeit(fn, repeat: int) -> tuple[float, float]:
    xs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t0)
    return statistics.median(xs), min(xs)


def bench_passive(repeat: int) -> None:
    from stalwart.health import GateConfig, run_gate
    from stalwart.health.gpu_fixtures import load_nvml_snapshot

    base, _ = timeit(lambda: load_nvml_snapshot(FIX / "h100" / "nvml_snapshot.json"), repeat)
    fixture, _ = timeit(
        lambda: run_gate(GateConfig(fixture=FIX / "h100", expected_gpus=1), time.time()), repeat
    )
    live, _ = timeit(lambda: run_gate(GateConfig(), time.time()), repeat)
    print(
        f"passive, recorded H100 (snapshot + 360-sample burn + rules): {fixture * 1e3:8.1f} ms "
        f"(x{fixture / base:.1f} of reading the snapshot alone, {base * 1e3:.2f} ms)"
    )
    print(
        f"passive, live on this machine (NVML absent, dmesg, IB sysfs):  {live * 1e3:8.1f} ms "
        f"(x{live / base:.1f})"
    )
    py = [sys.executable, "-c", "import stalwart"]
    cli = [sys.executable, "-m", "stalwart.cli", "health", "check", "--json", "--fixture", str(FIX / "h100")]
    b, _ = timeit(lambda: subprocess.run(py, check=True, capture_output=True), repeat)
    c, _ = timeit(lambda: subprocess.run(cli, capture_output=True), repeat)
    print(
        f"`stalwart health check --fixture` as a process:                {c * 1e3:8.1f} ms "
        f"(x{c / b:.2f} of `python -c 'import stalwart'`, {b * 1e3:.0f} ms)"
    )


def bench_active() -> None:
    from stalwart.health.active import CPU_EXPECTATIONS, check_active, measure_active

    t0 = time.perf_counter()
    m = measure_active()
    total = time.perf_counter() - t0
    print(f"active suite on {m.device_kind}: {total:.2f} s total")
    for name, secs in m.seconds.items():
        print(f"  {name:11s} {secs:6.2f} s ({secs / total:5.1%} of the suite)")
    for f in check_active(m, CPU_EXPECTATIONS):
        print(f"  {f.severity.name:4s} {f.subject:10s} {f.message}")


def bench_slurm(repeat: int) -> None:
    import pytest

    from slurm_cluster import _stop, start_cluster

    with tempfile.TemporaryDirectory() as tmp:
        try:
            c = start_cluster(Path(tmp) / "slurm")
        except pytest.skip.Exception as exc:
            print(f"slurm: skipped ({exc})")
            return
        try:

            def drained(node):
                return "drain" in c.nodes()[node][0]

            raw, cli = [], []
            for i in range(repeat):
                t0 = time.perf_counter()
                c.run("scontrol", "update", "NodeName=node1", "State=DRAIN", "Reason=bench")
                while not drained("node1"):
                    pass
                raw.append(time.perf_counter() - t0)
                c.run("scontrol", "update", "NodeName=node1", "State=RESUME")
                state = Path(tmp) / f"state{i}"
                t0 = time.perf_counter()
                p = c.run(
                    sys.executable,
                    "-m",
                    "stalwart.cli",
                    "health",
                    "check",
                    "--backend",
                    "slurm",
                    "--node",
                    "node2",
                    "--fixture",
                    str(FIX / "h100_derived" / "xid48_kmsg"),
                    "--kernel-log",
                    "",
                    "--state-dir",
                    str(state),
                    check=False,
                )
                assert p.returncode == 1, p.stderr
                while not drained("node2"):
                    pass
                cli.append(time.perf_counter() - t0)
                c.run("scontrol", "update", "NodeName=node2", "State=RESUME")
                c.wait_for(lambda n: n["node1"][0] == "idle" and n["node2"][0] == "idle", what="idle again")
            r, k = statistics.median(raw), statistics.median(cli)
            print(
                f"failing check -> node drained in Slurm (CLI process, sinfo read-back): {k * 1e3:.0f} ms median "
                f"of {repeat} (min {min(cli) * 1e3:.0f}); raw scontrol drain + sinfo: {r * 1e3:.0f} ms "
                f"-> x{k / r:.1f}"
            )
        finally:
            _stop(c.procs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-slurm", action="store_true")
    args = ap.parse_args()
    import os

    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
    bench_passive(args.repeat)
    bench_active()
    if not args.no_slurm:
        bench_slurm(args.repeat)


if __name__ == "__main__":
    main()
