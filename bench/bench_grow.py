"""A lost node comes back: the shrunk group takes it back in place, against a whole-group restart that
admits it, at 3, 4 and 6 nodes (one rank each by default).

Each node is one ``stalwart run`` agent over loopback (``--nnodes 2:N``, any size valid, the c10d
rendezvous on the first agent), running the same DDP job (stalwart.examples.charlm, a checkpoint every
EVERY steps). The agent of node n1 is SIGKILLed with its rank at step KILL_STEP; once the group trains
without it, n1's agent starts again (the repaired host: same name, same address). Two ways:

* ``grow in place`` (default): the group shrank in place; n1's agent finds the running round's worker
  store, offers a free place, is invited, starts its rank while the group trains on, and once that
  rank is about to join, the group re-forms at the next step boundary: the survivors keep their
  processes and a replica sends the newcomer the live state;
* ``whole-group restart`` (``--no-in-place``): the group restarted whole at N-1 nodes after the loss;
  n1's agent joins the rendezvous, every agent sees a node waiting, stops its workers, and the group
  restarts at N nodes warm from the fork servers and loads the newest checkpoint.

Measured from the merged ledger, for the return only: the pause (the longest time any surviving rank
went without completing a step around the re-formation: from its last step before to its first at
N ranks), the return (n1's agent started -> every one of N ranks completed a step at N ranks), and the
steps lost (grow: the ledger's ``lost_steps``; whole: steps completed before the restart that the
checkpoint did not hold).

Run: .venv/bin/python bench/bench_grow.py [--nodes 3,4,6] [--repeats 1] [--last-call 4]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench_inplace_nodes import agent, free_port, listening, steps_redone

from stalwart.errors import LedgerError
from stalwart.events import AttemptStarted, ReformedInPlace, StepCompleted
from stalwart.ledger import read_merged

STEPS, EVERY, KILL_STEP = 600, 10, 27
JOB = ["-m", "stalwart.examples.charlm", "--corpus-bytes", "300000", "--log-every", "0"]
JOB += ["--steps", str(STEPS), "--checkpoint-every", str(EVERY), "--global-batch", "60"]  # 2 to 6 ranks


def _events(run_dir: Path) -> list:
    try:
        return read_merged(run_dir)
    except (LedgerError, OSError, ValueError):
        return []  # a ledger still being started


def _wait(what: str, check, procs, timeout_s: float = 600.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        if all(p.poll() is not None for p in procs):
            break
        time.sleep(0.5)
    raise RuntimeError(f"{what} did not happen")


def run(work: Path, nodes: int, per_node: int, in_place: bool, last_call: float) -> dict:
    run_dir, port, world = work / "run", free_port(), nodes * per_node
    common = (per_node, f"2:{nodes}", "bench-grow", last_call)
    procs = []
    try:
        for i in range(nodes):
            chaos = f"kill-agent@node=1,step={KILL_STEP}" if i == 1 else ""
            procs.append(agent(run_dir, port, i, *common, chaos, in_place, JOB))
            if i == 0:
                listening(port, procs[0])

        def smaller() -> bool:  # the group trains at N-1 nodes
            evs = _events(run_dir)
            if in_place:
                return any(isinstance(e, ReformedInPlace) and e.shrunk_from for e in evs)
            later = [e.ts for e in evs if isinstance(e, AttemptStarted) and e.attempt > 0]
            return bool(later) and any(isinstance(e, StepCompleted) and e.ts > max(later) for e in evs)

        _wait("training at the smaller size", smaller, procs)
        procs[1].wait(timeout=60)
        back_at = time.time()
        procs[1] = agent(run_dir, port, 1, *common, "", in_place, JOB)

        def full() -> list:  # every one of N ranks completed a step in a group of N
            evs = _events(run_dir)
            at = [e.ts for e in evs if isinstance(e, ReformedInPlace) and e.grown_from]
            at += [
                e.ts
                for e in evs
                if isinstance(e, AttemptStarted) and e.world_size == world and e.ts > back_at
            ]
            if not at:
                return []
            after = [e for e in evs if isinstance(e, StepCompleted) and e.start >= min(at) - 1.0]
            mine = {(e.node, e.rank) for e in after if e.ts > back_at}
            return evs if len(mine) >= world and any(e.node == "n1" for e in after) else []

        _wait("the return", full, procs)
        outs = [p.communicate(timeout=1800)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(p.returncode != 0 for p in procs):
        raise RuntimeError("an agent failed: " + "\n".join(o[-1500:] for o in outs))
    return measure(read_merged(run_dir), back_at, world, in_place)


def measure(evs: list, back_at: float, world: int, in_place: bool) -> dict:
    steps = [e for e in evs if isinstance(e, StepCompleted)]
    grown = [e for e in evs if isinstance(e, ReformedInPlace) and e.grown_from]
    restarts = [e for e in evs if isinstance(e, AttemptStarted) and e.ts > back_at and e.world_size == world]
    if in_place and not grown:
        raise RuntimeError("the in-place run did not grow back in place")
    if not in_place and not restarts:
        raise RuntimeError("the whole-group run did not restart at the full size")
    change = grown[0].ts if in_place else min(e.ts for e in restarts)
    full = [e for e in steps if e.ts > change]
    first_full = {}
    for e in full:
        key = (e.node, e.rank)
        first_full[key] = min(first_full.get(key, e.ts), e.ts)
    before = [e for e in steps if e.node != "n1" and back_at < e.ts <= change]
    pauses = []
    for key in {(e.node, e.rank) for e in before}:
        last = max(e.ts for e in before if (e.node, e.rank) == key)
        nxt = [t for k, t in first_full.items() if k == key]
        if not nxt:  # its rank was restarted: its first step after, at whatever rank it took
            nxt = [min(e.ts for e in full if e.node == key[0])]
        pauses.append(min(nxt) - last)
    row: dict = {"pause_s": max(pauses), "return_s": max(first_full.values()) - back_at}
    if in_place:
        gen = grown[0].generation  # the newcomer's own record holds what it received
        moved = sum(e.bytes_moved for e in evs if isinstance(e, ReformedInPlace) and e.generation == gen)
        row.update(steps_lost=grown[0].lost_steps, phases=grown[0].phases, bytes_moved=moved)
    else:
        row["steps_lost"] = steps_redone(evs, change)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="3,4,6")
    ap.add_argument("--per-node", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--last-call", type=float, default=4.0, help="the rendezvous round's last_call_timeout")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    arms = {"grow in place": True, "whole-group restart": False}
    res: dict = {"cpus": os.cpu_count(), "load_before": os.getloadavg(), "nodes": {}}
    for n in [int(x) for x in args.nodes.split(",")]:
        rows: dict[str, list[dict]] = {name: [] for name in arms}
        for i in range(args.repeats):
            for name, in_place in arms.items():
                work = Path(tempfile.mkdtemp(prefix=f"bench-grow-{n}-"))
                try:
                    r = run(work, n, args.per_node, in_place, args.last_call)
                finally:
                    shutil.rmtree(work, ignore_errors=True)
                rows[name].append(r)
                extra = f", phases {r['phases']}, {r['bytes_moved']} bytes" if "phases" in r else ""
                print(
                    f"{n} nodes, round {i + 1}, {name}: pause {r['pause_s']:.2f}s, return -> every rank "
                    f"stepping {r['return_s']:.2f}s, steps lost {r['steps_lost']}{extra}",
                    flush=True,
                )
        res["nodes"][n] = rows
    print(f"\nmedians (load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs)")
    print("nodes | pause: grow / whole | return -> all stepping: grow / whole | steps lost (grow/whole)")
    for n, rows in res["nodes"].items():
        med = {
            k: (statistics.median(r["pause_s"] for r in v), statistics.median(r["return_s"] for r in v))
            for k, v in rows.items()
        }
        lost = "/".join(str(max(r["steps_lost"] for r in v)) for v in rows.values())
        g, w = med["grow in place"], med["whole-group restart"]
        print(f"{n:5d} | {g[0]:.2f}s / {w[0]:.2f}s | {g[1]:.2f}s / {w[1]:.2f}s | {lost}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
