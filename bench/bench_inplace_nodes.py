"""In-place recovery across nodes against a whole-group restart, at 2, 4 and 8 nodes: how the cost of one
rank's crash grows with the number of agents.

Each node is one ``stalwart run`` agent over loopback (``--nnodes N``, one rank per node by default,
the c10d rendezvous on the first agent), running the same DDP job (stalwart.examples.charlm, a
checkpoint every EVERY steps). Rank 1 (on node n1) is SIGKILLed at step CRASH_STEP, two ways:

* ``in-place``: n1's agent replaces the rank and announces the new generation; every other node's
  agent joins it, so their ranks keep their processes and hand over the live state;
* ``whole``: ``--no-in-place``: every node's workers stop, the agents re-rendezvous, the group restarts
  warm from the fork servers and loads the newest checkpoint.

Measured from the merged ledger: fault -> every rank completed a step that began after the fault was
detected (the first productive step of the whole group), and the steps lost (in place: the ledger's
``lost_steps``; whole: the steps completed before the fault that the checkpoint did not hold).

``--against-src DIR`` instead compares in place with in place under another checkout's ``src`` (the
agents run with ``PYTHONPATH=DIR``): a change to the recovery path against the code before it, in the
same run.

Run: .venv/bin/python bench/bench_inplace_nodes.py [--nodes 2,4,8] [--per-node 1] [--repeats 1]
[--against-src DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from stalwart.account.startup import PHASES, startups
from stalwart.events import (
    ChaosInjected,
    FailureDetected,
    JobStarted,
    ReformedInPlace,
    StepCompleted,
    TrainingResumed,
)
from stalwart.ledger import read_merged

STEPS, EVERY, CRASH_STEP = 40, 10, 27
JOB = ["-m", "stalwart.examples.charlm", "--corpus-bytes", "300000", "--log-every", "0"]
JOB += ["--steps", str(STEPS), "--checkpoint-every", str(EVERY)]


def steps_redone(evs: list, at: float) -> int:
    """Steps completed before ``at`` that the next resume did not hold (a whole-group restart's
    rollback): the last completed step is an index, the resume point a count."""
    done = max((e.step for e in evs if isinstance(e, StepCompleted) and e.ts <= at), default=0)
    resumed = min((e.step for e in evs if isinstance(e, TrainingResumed) and e.ts > at), default=0)
    return max(0, done + 1 - resumed)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int, proc: subprocess.Popen, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("the first agent exited before hosting the rendezvous store")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError("the rendezvous store never listened")


def agents(
    run_dir: Path,
    nodes: int,
    per_node: int,
    nnodes: str,
    tag: str,
    last_call: float,
    chaos: str,
    in_place: bool,
    job: list[str],
    src: str = "",
) -> tuple[list[subprocess.Popen], list[str]]:
    """Start ``nodes`` agents of ``job`` over loopback (one address each, the rendezvous store on the first), wait
    for all of them, and return them with their output; every agent left running is killed."""
    port = free_port()
    procs: list[subprocess.Popen] = []
    try:
        for i in range(nodes):
            procs.append(agent(run_dir, port, i, per_node, nnodes, tag, last_call, chaos, in_place, job, src))
            if i == 0:
                listening(port, procs[0])
        return procs, [p.communicate(timeout=1800)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def agent(
    run_dir: Path,
    port: int,
    i: int,
    per_node: int,
    nnodes: str,
    tag: str,
    last_call: float,
    chaos: str,
    in_place: bool,
    job: list[str],
    src: str = "",
) -> subprocess.Popen:
    """Start node ``n<i>``'s agent (address 127.0.0.<i+1>) of ``job`` on the rendezvous at ``port`` (``src``:
    the checkout's source directory the agent and its workers import, instead of this one's)."""
    cmd = [sys.executable, "-m", "stalwart.cli", "run", "-q", "--nnodes", nnodes]
    cmd += ["--nproc-per-node", str(per_node), "--rdzv-endpoint", f"127.0.0.1:{port}"]
    cmd += ["--rdzv-id", tag, "--rdzv-conf", f"last_call_timeout={last_call:g}"]
    cmd += ["--run-dir", str(run_dir), "--node-name", f"n{i}", "--local-addr", f"127.0.0.{i + 1}"]
    cmd += ["--chaos", chaos] if chaos else []
    cmd += [] if in_place else ["--no-in-place"]
    env = {**os.environ, "PYTHONPATH": src} if src else None
    return subprocess.Popen(
        [*cmd, *job], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )


def run(work: Path, nodes: int, per_node: int, in_place: bool, src: str = "") -> dict:
    run_dir = work / "run"
    chaos = f"crash@rank=1,step={CRASH_STEP}"
    procs, outs = agents(run_dir, nodes, per_node, str(nodes), "bench-nodes", 60, chaos, in_place, JOB, src)
    if any(p.returncode != 0 for p in procs):
        raise RuntimeError("an agent failed: " + "\n".join(o[-1500:] for o in outs))
    evs = read_merged(run_dir)
    fault = min(e.ts for e in evs if isinstance(e, ChaosInjected) and e.fault.startswith("crash"))
    detected = min(e.ts for e in evs if isinstance(e, FailureDetected) and e.ts >= fault)
    steps = [e for e in evs if isinstance(e, StepCompleted)]
    ranks = {e.rank for e in steps}
    firsts = [min(e.ts for e in steps if e.rank == r and e.start > detected) for r in ranks]
    row: dict = {"first_step_s": max(firsts) - fault, "detect_s": detected - fault}
    # the group's own step time before the fault (past the first steps' warm-up): the share of
    # "fault -> first step" that is the step itself, whatever the recovery
    steady = [e.duration for e in steps if e.ts < fault and e.step >= 5]
    row["step_s"] = round(statistics.median(steady), 3) if steady else None
    row["startup"] = startup_phases(evs)
    reformed = [e for e in evs if isinstance(e, ReformedInPlace)]
    if in_place:
        if not reformed:
            raise RuntimeError("the in-place run did not recover in place")
        row.update(
            steps_lost=reformed[0].lost_steps, phases=reformed[0].phases, bytes_moved=reformed[0].bytes_moved
        )
    else:
        row["steps_lost"] = steps_redone(evs, fault)
    return row


def startup_phases(evs: list) -> dict:
    """Launch -> first step across the nodes: each phase's median and slowest node
    (stalwart.account.startup), and the first agent's start -> the last node's first step."""
    nodes = startups(evs)
    out: dict = {}
    for phase in PHASES:
        vals = [n.phases[phase] for n in nodes if n.phases[phase] is not None]
        if vals:
            out[phase] = {"median": round(statistics.median(vals), 3), "max": round(max(vals), 3)}
    began = min((e.ts for e in evs if isinstance(e, JobStarted)), default=None)
    first = [
        min((e.start for e in evs if isinstance(e, StepCompleted) and e.node == n.node), default=None)
        for n in nodes
    ]
    if began is not None and first and None not in first:
        out["launch_to_first_step_s"] = round(max(f for f in first if f is not None) - began, 2)
    return out


def compare(
    nodes: list[int], repeats: int, arms: dict[str, Callable[[Path, int], dict]], prefix: str, json_path: str
) -> None:
    """Run every arm (name -> run(work dir, nodes)) ``repeats`` times at each size, each in a fresh
    work directory; print every run, then the median fault -> first step per size, the first arm
    against the second, and the most steps lost."""
    first, second = list(arms)
    res: dict = {"cpus": os.cpu_count(), "load_before": os.getloadavg(), "nodes": {}}
    for n in nodes:
        rows: dict[str, list[dict]] = {name: [] for name in arms}
        for i in range(repeats):
            for name, arm in arms.items():
                work = Path(tempfile.mkdtemp(prefix=f"{prefix}-{n}-"))
                try:
                    rows[name].append(arm(work, n))
                finally:
                    shutil.rmtree(work, ignore_errors=True)
                r = rows[name][-1]
                print(
                    f"{n} nodes, round {i + 1}, {name}: fault -> first step {r['first_step_s']:.2f}s "
                    f"(detect {r['detect_s']:.2f}s, a step {r['step_s']}s), steps lost {r['steps_lost']}"
                    + (f", phases {r['phases']}" if "phases" in r else "")
                    + (f", start-up {r['startup']}" if r.get("startup") else ""),
                    flush=True,
                )
        res["nodes"][n] = rows
    print(
        f"\nfault -> first productive step, median (load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs)"
    )
    print(f"nodes | {first} | {second} | {second} / {first} | steps lost ({first}/{second})")
    for n, rows in res["nodes"].items():
        med = {k: statistics.median(r["first_step_s"] for r in v) for k, v in rows.items()}
        lost = "/".join(str(max(r["steps_lost"] for r in v)) for v in rows.values())
        print(f"{n:5d} | {med[first]:.2f}s | {med[second]:.2f}s | {med[second] / med[first]:.1f}x | {lost}")
    if json_path:
        Path(json_path).write_text(json.dumps(res, indent=1, default=str))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="2,4,8")
    ap.add_argument("--per-node", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json", default="")
    ap.add_argument(
        "--against-src", default="", help="compare in place with in place under this src directory"
    )
    args = ap.parse_args()
    arms = {
        "in-place": lambda work, n: run(work, n, args.per_node, True),
        "whole-group restart": lambda work, n: run(work, n, args.per_node, False),
    }
    if args.against_src:
        other = str(Path(args.against_src).resolve())
        arms = {
            "in-place": arms["in-place"],
            "in-place, other src": lambda work, n: run(work, n, args.per_node, True, other),
        }
    compare([int(x) for x in args.nodes.split(",")], args.repeats, arms, "bench-inplace-nodes", args.json)


if __name__ == "__main__":
    main()
